"""A resumed stream with stop strings: the text the first worker held back, and stop strings
that span the switch, come out as from one uninterrupted vLLM stream (stop_resume.py)."""

from prometheus_client import CollectorRegistry
from vllm import SamplingParams as VllmSamplingParams

from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.engines.mock_stops import apply_stop_strings
from vllm_fleet.worker.prepare import PreparedInput
from vllm_fleet.worker.request_stream import RequestStream
from vllm_fleet.worker.resume.stops import earliest_stop, for_resume

PIECES = {100: "<|user|> Where?", 101: "\n",
          1: " The", 2: " cap", 3: "ital", 4: " is", 5: " Par", 6: "is", 7: ".", 8: "i", 9: "s", 10: " Rome"}
ANSWER = [1, 2, 3, 4, 5]   # " The capital is Par": vLLM holds back " Par" for the stop "Paris"


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def resumed(stop: list[str], delivered: int | None, *, include: bool = False, min_tokens: int = 0):
    params = VllmSamplingParams(stop=stop, include_stop_str_in_output=include, min_tokens=min_tokens)
    return for_resume(decode, [100, 101], list(ANSWER), delivered, params)


def run(resume, *steps: list[int], finish_last: str | None = None) -> tuple[str, list[int], list[SampleDelta]]:
    """Feed engine deltas of these token ids (text as the engine would send it, unbuffered);
    the text and ids the client gets, and the deltas that came out."""
    text, ids, out = "", [], []
    for number, step in enumerate(steps):
        finish = finish_last if number == len(steps) - 1 else None
        delta = resume.filter(SampleDelta(0, decode(step), list(step), finish_reason=finish))
        if delta is None:
            continue
        out.append(delta)
        text += delta.text
        ids += delta.token_ids
    return text, ids, out


DELIVERED = len(" The capital is")   # all but the last len("Paris") - 1 characters


def test_held_text_that_completes_a_stop_string_across_the_switch_ends_the_stream():
    resume = resumed(["Paris"], DELIVERED)
    text, ids, out = run(resume, [6, 7], [10])
    assert text == " "                          # " The capital is " + nothing of "Paris"
    assert ids == [6]                            # ids through the one that completed it
    assert (out[-1].finish_reason, out[-1].stop_reason) == ("stop", "Paris")
    assert resume.ended and len(out) == 1        # later engine output is dropped


def test_held_text_is_held_while_it_may_still_begin_the_stop_string():
    resume = resumed(["Paris"], DELIVERED)
    first, _, _ = run(resume, [8])              # " Pari": still the start of "Paris"
    assert first == " "                          # only what can no longer begin it
    rest, ids, out = run(resume, [9])
    assert rest == "" and ids == [9] and out[-1].stop_reason == "Paris"


def test_held_text_that_does_not_complete_a_stop_string_comes_first():
    resume = resumed(["Paris"], DELIVERED)
    text, ids, out = run(resume, [7], [10], finish_last="length")
    assert text == " Par. Rome" and ids == [7, 10]
    assert out[-1].finish_reason == "length" and out[-1].stop_reason is None


def test_with_the_stop_string_included_the_text_runs_through_it():
    # vLLM holds nothing back then: the caller has all of " The capital is Par".
    resume = resumed(["Paris"], None, include=True)
    text, ids, out = run(resume, [6, 7])
    assert text == "is" and ids == [6]
    assert (out[-1].finish_reason, out[-1].stop_reason) == ("stop", "Paris")


def test_a_stop_string_within_the_new_text_is_left_to_the_engine():
    resume = resumed(["Rome"], len(" The capital is Par") - 3)
    engine_final = SampleDelta(0, "", [10], finish_reason="stop", stop_reason="Rome")  # the engine cut it
    assert resume.filter(engine_final).text == "Par"   # held back for "Rome": its last 3 characters
    assert engine_final.stop_reason == "Rome" and not resume.ended


def test_no_stop_string_counts_within_min_tokens():
    resume = resumed(["Paris"], DELIVERED, min_tokens=1)
    text, ids, _ = run(resume, [6], [7], finish_last="length")
    assert text == " Paris." and ids == [6, 7]


def test_nothing_to_do_without_stop_strings():
    assert resumed([], None) is None
    assert resumed([], DELIVERED) is None        # vLLM holds nothing back then: the count is not trusted


def test_held_text_is_sent_even_when_no_stop_string_can_span_the_switch():
    resume = resumed(["Rome", "xyz"], len(" The capital is Par") - 3)   # " Par" begins neither
    text, _, _ = run(resume, [7])
    assert text == "Par."


def test_the_earliest_ending_stop_string_wins_then_list_order():
    assert earliest_stop("xx abcd", 2, ["bcd", "cd"]) == ("bcd", 4)
    assert earliest_stop("xx abcd", 2, ["abcdef", "d"]) == ("d", 6)
    assert earliest_stop("xx abcd", 1, ["ab"]) is None   # it ended before the new characters


def test_request_stream_ends_the_input_at_a_stop_string_across_the_switch():
    params = VllmSamplingParams(stop=["Paris"])
    item = PreparedInput(prompt_token_ids=[100, 101, *ANSWER], engine_params=params, prompt_len=2,
                         stop_resume=for_resume(decode, [100, 101], list(ANSWER), DELIVERED, params))
    stream = RequestStream([item], 1, 0.0, WorkerMetrics(CollectorRegistry()), started=0.0)
    chunks = stream.on_deltas(0, [SampleDelta(0, "", [6, 7])], now=1.0)
    assert [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in chunks] == [(" ", [6], "stop", "Paris")]
    assert chunks[0].usage.completion_tokens == 1
    assert stream.open_inputs == 0              # the service ends the call and stops the engine request
    assert stream.on_deltas(0, [SampleDelta(0, " Rome", [10])], now=1.1) == []
    assert stream.on_end(0, aborted=True) == [] and stream.open_inputs == 0


def test_the_mock_engine_holds_back_and_cuts_text_as_vllm_does():
    params = VllmSamplingParams(stop=["Paris"])
    steps = iter([[SampleDelta(0, decode([i]), [i])] for i in [*ANSWER, 6, 7]])
    out = [deltas[0] for deltas in apply_stop_strings(steps, params, decode)]
    assert "".join(d.text for d in out[:5]) == " The capital is"      # " Par" held back
    assert out[-1].text == " " and out[-1].token_ids == [6]
    assert (out[-1].finish_reason, out[-1].stop_reason) == ("stop", "Paris")
    included = VllmSamplingParams(stop=["Paris"], include_stop_str_in_output=True)
    steps = iter([[SampleDelta(0, decode([i]), [i])] for i in [*ANSWER, 6, 7]])
    assert "".join(d[0].text for d in apply_stop_strings(steps, included, decode)) == " The capital is Paris"
