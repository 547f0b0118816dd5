"""vLLM's meaning for a request body: its own request models, renderer and tool/reasoning parsers.

Nothing here decides what a field means; it hands the body to vLLM and turns vLLM's refusals
into InvalidRequestError naming the field.
"""
