"""The single definition of the system events Respawn routes from Cloud Audit Logs to the control plane.

- `METHODS`: the protoPayload.methodName values we react to (functions/ decodes events with it).
- `sink_filter(project)`: the Logging filter text deploy/ gives to `gcloud logging sinks create --log-filter`.
- `matches(entry, project)`: whether a LogEntry (as JSON dict) passes that filter; sim/'s sink router uses it.

Both come from one filter structure (`filter_spec`): `sink_filter` renders it, `matches` evaluates it, so the
deployed sink and the local router cannot drift apart. Imports no cloud client library.

The filter admits the self-test's probe log (respawn.selftest.LOG_ID), and every routed method inside the `system_event` log, and Cloud TPU's `tpu.nodes.terminate` by its
method and a `projects/P/` resource name whatever log carries it and whatever its serviceName: that is what the one
public filter for these entries selects on; their log and serviceName have no public source (gcp-facts §2).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import selftest

SYSTEM_EVENT_LOG_ID = "cloudaudit.googleapis.com/system_event"

# Compute Engine system events after which a node no longer serves (see docs/gcp-facts.md §1).
PREEMPTED = "compute.instances.preempted"
HOST_ERROR = "compute.instances.hostError"
GUEST_TERMINATE = "compute.instances.guestTerminate"
TERMINATE_ON_HOST_MAINTENANCE = "compute.instances.terminateOnHostMaintenance"
# Cloud TPU: one event per lost TPU node, the cause in protoPayload.metadata.terminateReason (gcp-facts §2).
TPU_NODE_TERMINATE = "tpu.nodes.terminate"

COMPUTE_METHODS: tuple[str, ...] = (PREEMPTED, HOST_ERROR, GUEST_TERMINATE, TERMINATE_ON_HOST_MAINTENANCE)
TPU_METHODS: tuple[str, ...] = (TPU_NODE_TERMINATE,)
METHODS: tuple[str, ...] = COMPUTE_METHODS + TPU_METHODS


def log_name(project: str, log_id: str = SYSTEM_EVENT_LOG_ID) -> str:
    """The LogEntry.logName: the log ID's slash is URL-encoded."""
    return f"projects/{project}/logs/{log_id.replace('/', '%2F')}"


@dataclass(frozen=True)
class Eq:
    """`field="value"`"""

    field: str
    value: str


@dataclass(frozen=True)
class AnyOf:
    """`field=("a" OR "b")`"""

    field: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Has:
    """`field:"value"`: the Logging query language's has operator, a substring test that ignores case."""

    field: str
    value: str


@dataclass(frozen=True)
class All:
    """`term AND term ...`"""

    terms: tuple


@dataclass(frozen=True)
class Either:
    """`(term) OR (term) ...`"""

    terms: tuple


def filter_spec(project: str) -> Either:
    return Either((
        All((Eq("logName", log_name(project)), AnyOf("protoPayload.methodName", METHODS))),
        # Selected as the public example does (gcp-facts §2): by method and the project's resource names, in any log.
        All((Eq("protoPayload.methodName", TPU_NODE_TERMINATE),
             Has("protoPayload.resourceName", f"projects/{project}/"))),
        # The deployment's self-test probe (respawn.selftest): proves the sink, its writer and on_log_event.
        Eq("logName", selftest.log_name(project)),
    ))


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(node) -> str:
    if isinstance(node, Eq):
        return f"{node.field}={_quote(node.value)}"
    if isinstance(node, AnyOf):
        return f"{node.field}=(" + " OR ".join(_quote(v) for v in node.values) + ")"
    if isinstance(node, Has):
        return f"{node.field}:{_quote(node.value)}"
    if isinstance(node, All):
        return " AND ".join(render(t) for t in node.terms)
    if isinstance(node, Either):
        # The Logging query language gives OR a higher precedence than AND: every operand is parenthesised.
        return " OR ".join(f"({render(t)})" for t in node.terms)
    raise TypeError(f"unknown filter node {node!r}")


def _field(entry: dict, path: str):
    value = entry
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def evaluate(node, entry: dict) -> bool:
    if isinstance(node, Eq):
        return _field(entry, node.field) == node.value
    if isinstance(node, AnyOf):
        return _field(entry, node.field) in node.values
    if isinstance(node, Has):
        value = _field(entry, node.field)
        return isinstance(value, str) and node.value.lower() in value.lower()
    if isinstance(node, All):
        return all(evaluate(t, entry) for t in node.terms)
    if isinstance(node, Either):
        return any(evaluate(t, entry) for t in node.terms)
    raise TypeError(f"unknown filter node {node!r}")


def sink_filter(project: str) -> str:
    return render(filter_spec(project))


def matches(entry: dict, project: str) -> bool:
    return evaluate(filter_spec(project), entry)
