"""Google's discovery documents (tests/discovery/, vendored by tests/discovery/regenerate.py) as a checker of
requests and answers: a body against a method's request or response schema (unknown fields, wrong JSON types,
int64 not as a string, values outside an enum, malformed timestamps and durations), and a URL against the method's
path template (`{+name}` expansions against their patterns, path segments against theirs, every query parameter
one the method or the API takes, of its type and enum).

Discovery schemas mark no field required (the proto parse of tests/test_sim_fidelity.py stands beside this), so a
missing field is never a problem here. Every check returns the problems found, each one line naming where.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

DOCUMENTS = Path(__file__).resolve().parent / "discovery"
# The client libraries' REST transports send `$alt=json;enum-encoding=int`: a system parameter every Google API
# takes (https://cloud.google.com/apis/docs/system-parameters), which the documents do not list.
SYSTEM_PARAMETERS = {"$alt": re.compile(r"json(;enum-encoding=int)?")}
_DURATION = re.compile(r"-?\d+(\.\d{1,9})?s")
_INT64_RANGE = {"int64": (-2**63, 2**63 - 1), "uint64": (0, 2**64 - 1), "int32": (-2**31, 2**31 - 1),
                "uint32": (0, 2**32 - 1)}


@dataclass(frozen=True)
class Method:
    api: "Api"
    id: str
    http_method: str
    path: str  # the template under the API's service path
    parameters: dict
    request: str | None  # schema name
    response: str | None
    media_download: bool  # alt=media: the data, not the resource (objects.get)
    download_service: bool  # the data also at /download/{servicePath}{path} (the media download service)
    upload_paths: tuple[str, ...]  # media upload templates (absolute), e.g. /upload/storage/v1/b/{bucket}/o


class Api:
    def __init__(self, doc: dict):
        self.doc = doc
        self.name = f"{doc['name']}.{doc['version']}"
        self.revision = doc["revision"]
        self.service_path = "/" + doc.get("servicePath", "")
        self.schemas: dict = doc["schemas"]
        self.parameters: dict = doc.get("parameters", {})
        self.methods: dict[str, Method] = {}
        self._collect(doc.get("resources", {}))

    def _collect(self, resources: dict) -> None:
        for resource in resources.values():
            for m in resource.get("methods", {}).values():
                protocols = (m.get("mediaUpload") or {}).get("protocols", {})
                self.methods[m["id"]] = Method(
                    self, m["id"], m["httpMethod"], m["path"], m.get("parameters", {}),
                    (m.get("request") or {}).get("$ref"), (m.get("response") or {}).get("$ref"),
                    bool(m.get("supportsMediaDownload")), bool(m.get("useMediaDownloadService")),
                    tuple(p["path"] for p in protocols.values()))
            self._collect(resource.get("resources", {}))


@lru_cache(maxsize=None)
def apis() -> dict[str, Api]:
    """Every vendored document, by name.version (compute.v1, ...)."""
    return {api.name: api for api in (Api(json.loads(p.read_text())) for p in sorted(DOCUMENTS.glob("*.json")))}


def method(method_id: str) -> Method:
    """A vendored method by its discovery id (compute.instances.insert); KeyError names the fix."""
    for api in apis().values():
        if method_id in api.methods:
            return api.methods[method_id]
    raise KeyError(f"no vendored discovery method {method_id!r}: add it to METHODS in tests/discovery/regenerate.py "
                   "and run it")


# --- bodies -------------------------------------------------------------------------------------------------------

def check_request(m: Method, body: Any) -> list[str]:
    """Problems of a JSON request body of `m` (None: no body, which any method may get; a method that takes none
    must get none)."""
    if body is None:
        return []
    if m.request is None:
        return [] if body in (None, {}, b"") else [f"{m.id} takes no request body, got {_short(body)}"]
    return check(m.api, {"$ref": m.request}, body, m.request)


def check_response(m: Method, body: Any) -> list[str]:
    """Problems of a JSON answer of `m` (a method with no response schema answers an empty body)."""
    if m.response is None:
        return [] if body in (None, {}, b"") else [f"{m.id} answers no body, got {_short(body)}"]
    return check(m.api, {"$ref": m.response}, body, m.response)


def check(api: Api, schema: dict, value: Any, where: str) -> list[str]:
    """Problems of `value` against `schema` (a discovery schema or a {"$ref": name}), each prefixed by its path."""
    while "$ref" in schema:
        schema = api.schemas[schema["$ref"]]
    kind = schema.get("type")
    if value is None:  # JSON null: only google.protobuf.NullValue (Firestore's nullValue) and `any` hold it
        return [] if kind == "any" or schema.get("enum") == ["NULL_VALUE"] else [f"{where}: null"]
    if kind == "any":
        return []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: {_short(value)} is not an object"]
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        problems = []
        for key, item in value.items():
            if key in props:
                problems += check(api, props[key], item, f"{where}.{key}")
            elif extra is not None:
                problems += check(api, extra, item, f"{where}[{key!r}]")
            else:
                problems.append(f"{where}.{key}: no such field in {schema.get('id', 'the schema')}")
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: {_short(value)} is not an array"]
        return [p for i, item in enumerate(value) for p in check(api, schema.get("items", {}), item, f"{where}[{i}]")]
    if kind == "string":
        return _string(schema, value, where)
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: {_short(value)} is not an integer"]
        return _in_range(schema.get("format"), value, where)
    if kind == "number":
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              or value in ("NaN", "Infinity", "-Infinity"))
        return [] if ok else [f"{where}: {_short(value)} is not a number"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{where}: {_short(value)} is not a boolean"]
    raise ValueError(f"{where}: a discovery schema of type {kind!r} (this checker knows object, array, string, "
                     "integer, number, boolean, any)")


def _string(schema: dict, value: Any, where: str) -> list[str]:
    if not isinstance(value, str):
        what = "an int64 as a string" if schema.get("format") in ("int64", "uint64") else "a string"
        return [f"{where}: {_short(value)} is not {what}"]
    fmt = schema.get("format")
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {', '.join(schema['enum'])}"]
    if fmt in ("int64", "uint64"):
        try:
            return _in_range(fmt, int(value), where)
        except ValueError:
            return [f"{where}: {value!r} is not an {fmt}"]
    if fmt in ("date-time", "google-datetime"):
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return [f"{where}: {value!r} is not an RFC 3339 timestamp"]
        if not re.search(r"([Zz]|[+-]\d\d:\d\d)$", value):
            return [f"{where}: {value!r} has no time zone (RFC 3339 needs Z or an offset)"]
    if fmt == "google-duration" and not _DURATION.fullmatch(value):
        return [f"{where}: {value!r} is not a duration (seconds with an 's', e.g. '3.5s')"]
    if fmt == "byte":
        try:
            base64.b64decode(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            return [f"{where}: {value[:40]!r} is not base64"]
    return []


def _in_range(fmt: str | None, value: int, where: str) -> list[str]:
    low, high = _INT64_RANGE.get(fmt or "int32", (-2**63, 2**64))
    return [] if low <= value <= high else [f"{where}: {value} is out of the range of {fmt}"]


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- URLs ---------------------------------------------------------------------------------------------------------

def check_url(m: Method, http_method: str, url: str) -> list[str]:
    """Problems of a request `http_method url` (path and query; the host is not checked) as a call of `m`."""
    parts = urlsplit(url)
    problems = [] if http_method == m.http_method else [f"{m.id} is {m.http_method}, not {http_method}"]
    query = parse_qsl(parts.query, keep_blank_values=True)
    templates = _templates(m, dict(query))
    params = next((p for p in (_match(t, parts.path) for t in templates) if p is not None), None)
    if params is None:
        return problems + [f"{parts.path} is not {m.id}'s path ({' or '.join(templates)})"]
    for name, raw in params.items():
        problems += _parameter(m, name, m.parameters[name], raw, "path")
    for name, raw in query:
        if name in SYSTEM_PARAMETERS:
            if not SYSTEM_PARAMETERS[name].fullmatch(raw):
                problems.append(f"{m.id}: system parameter {name}={raw!r}")
            continue
        spec = m.parameters.get(name) or m.api.parameters.get(name)
        if spec is None or spec.get("location") != "query":
            problems.append(f"{m.id} has no query parameter {name!r}")
        elif name == "alt" and raw == "media" and m.media_download:
            continue  # a download of the object's data: the method supports media download
        else:
            problems += _parameter(m, name, spec, raw, "query")
    return problems


def resolve(http_method: str, url: str) -> list[Method]:
    """Every vendored method that `http_method url` has the shape of (one, for a URL a Google API serves)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    def fits(m: Method) -> bool:
        matched = (_match(t, parts.path) for t in _templates(m, query))
        return any(p is not None and not [e for n, raw in p.items() for e in _parameter(m, n, m.parameters[n], raw, "")]
                   for p in matched)

    return [m for api in apis().values() for m in api.methods.values() if m.http_method == http_method and fits(m)]


def _templates(m: Method, query: dict[str, str]) -> tuple[str, ...]:
    """The absolute path templates a call of `m` with this query may have (a media upload's or download's too)."""
    plain = m.api.service_path + m.path
    if query.get("uploadType") is not None and m.upload_paths:
        return m.upload_paths
    if query.get("alt") == "media" and m.download_service:
        return plain, "/download" + plain
    return (plain,)


def _match(template: str, path: str) -> dict[str, str] | None:
    """The path's parameters (raw, still percent-encoded) if `path` has the template's shape."""
    rx, names = "", []
    for literal, plus, name in re.findall(r"([^{]*)(?:\{(\+?)([^}]+)\})?", template):
        rx += re.escape(literal)
        if name:
            names.append(name)
            rx += f"(?P<p{len(names) - 1}>{'.+?' if plus else '[^/]+'})"
    found = re.fullmatch(rx, path)
    return None if found is None else {n: found.group(f"p{i}") for i, n in enumerate(names)}


def _parameter(m: Method, name: str, spec: dict, raw: str, where: str) -> list[str]:
    value = unquote(raw)
    label = f"{m.id} {where} parameter {name}={value!r}"
    kind = spec.get("type")
    if kind == "integer" and not re.fullmatch(r"-?\d+", value):
        return [f"{label}: not an integer"]
    if kind == "boolean" and value not in ("true", "false"):
        return [f"{label}: not true or false"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"{label}: not one of {', '.join(spec['enum'])}"]
    pattern = spec.get("pattern")
    if pattern and not re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value):
        return [f"{label}: does not match {pattern}"]
    return []
