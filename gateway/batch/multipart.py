"""A ``multipart/form-data`` body, read whole (pure): its fields and files."""

from __future__ import annotations

from dataclasses import dataclass


class FormError(ValueError):
    pass


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    data: bytes


def boundary(content_type: str) -> bytes:
    kind, _, rest = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise FormError("the body must be multipart/form-data (a file and its purpose)")
    for param in rest.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise FormError("the multipart/form-data body names no boundary")


def _params(disposition: str) -> dict[str, str]:
    out = {}
    for param in disposition.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        out[name.lower()] = value.strip().strip('"')
    return out


def parse(body: bytes, content_type: str) -> dict[str, Part]:
    """The parts by name; ``FormError`` when the body is not a form."""
    mark = b"--" + boundary(content_type)
    chunks = body.split(mark)
    if len(chunks) < 3:
        raise FormError("the multipart/form-data body has no parts")
    parts: dict[str, Part] = {}
    for chunk in chunks[1:-1]:
        chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise FormError("a part of the multipart/form-data body has no headers")
        disposition = ""
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition = value.strip()
        params = _params(disposition)
        if "name" not in params:
            raise FormError("a part of the multipart/form-data body has no name")
        parts[params["name"]] = Part(params["name"], params.get("filename"), data)
    return parts
