"""vLLM's serving methods are called with the arguments each release takes (0.26's render methods
take only the request; 0.32's and 0.26's tokenization also take the HTTP request)."""

from vllm_fleet.worker.openai.introspect import call_serving


class _Serving:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def with_raw_request(self, request, raw_request):  # vLLM 0.32
        self.calls.append((request, raw_request))
        return "answer"

    async def request_only(self, request):  # vLLM 0.26's ServingRender
        self.calls.append((request,))
        return "answer"


async def test_a_method_that_takes_the_http_request_gets_none_for_it():
    serving = _Serving()
    assert await call_serving(serving.with_raw_request, "req") == "answer"
    assert serving.calls == [("req", None)]


async def test_a_method_that_takes_only_the_request_gets_only_the_request():
    serving = _Serving()
    assert await call_serving(serving.request_only, "req") == "answer"
    assert serving.calls == [("req",)]
