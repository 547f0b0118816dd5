"""multipart/form-data, as POST /v1/files receives it (OpenAI's clients send `purpose` and `file`).

Split with bytes.split on the boundary rather than the stdlib email parser: an upload is up to
--batch-max-file-bytes of JSONL, which the email parser would walk line by line in Python; the
split is one pass in C. No dependency is added for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message

from vllm_fleet.gateway.api_error import bad_request


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    data: bytes


def parse_form(content_type: str, body: bytes) -> dict[str, Part]:
    """The form's parts by name; a 400 when the body is not multipart/form-data."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise bad_request("POST /v1/files takes multipart/form-data with the fields 'purpose' and 'file'",
                          code="invalid_content_type")
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    segments = (b"\r\n" + body).split(delimiter)
    if len(segments) < 2 or not segments[-1].startswith(b"--"):
        raise bad_request("the multipart body is cut short: no closing boundary", code="invalid_multipart")
    parts: dict[str, Part] = {}
    for segment in segments[1:-1]:
        head, sep, data = segment.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise bad_request("a multipart part has no header/body separator", code="invalid_multipart")
        part = _part(head.decode("utf-8", "replace"), data)
        if part is not None:
            parts[part.name] = part
    return parts


def _part(head: str, data: bytes) -> Part | None:
    headers = Message()
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip():
            headers[name.strip()] = value.strip()
    name = headers.get_param("name", header="content-disposition")
    if not isinstance(name, str):
        return None
    filename = headers.get_param("filename", header="content-disposition")
    return Part(name, filename if isinstance(filename, str) else None, data)
