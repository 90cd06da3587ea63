"""The recording stand-in for `gcloud` that tests/deploy_fixtures.py puts first on PATH for cloudbuild.yaml's steps.

Run as a script, once per gcloud call (a build makes some 180), it appends the invocation to a JSON-lines log and
keeps a small state file so that `describe`/`list` answer from what earlier calls created: a second build run sees
what the first made. `create` of something that exists fails with ALREADY_EXISTS, like the real API. It imports
nothing but the standard library's smallest modules (yaml only to read a binding's condition file): each call is a
fresh interpreter.
"""

from __future__ import annotations

import json
import os
import re
import sys

SINK_WRITER = "serviceAccount:service-123456789@gcp-sa-logging.iam.gserviceaccount.com"
PROJECT_NUMBER = "123456789"  # the stand-in project's number (Cloud Build's $PROJECT_NUMBER too)

# The verbs the stand-in understands. A verb that changes nothing is "read"; the rest are recorded as mutations.
READ_VERBS = {"describe", "list"}
CREATE_OR_UPDATE_VERBS = {"deploy", "update", "enable", "undelete", "add-iam-policy-binding",
                          "add-invoker-policy-binding", "cp"}
VERBS = READ_VERBS | CREATE_OR_UPDATE_VERBS | {"create", "delete", "remove-iam-policy-binding"}


class Call:
    def __init__(self, argv: list[str], group: str, verb: str, name: str, flags: dict[str, list[str]],
                 positionals: list[str]):
        self.argv, self.group, self.verb, self.name = argv, group, verb, name  # group: e.g. "pubsub topics"
        self.flags, self.positionals = flags, positionals  # name: the resource the call is about


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def parse(argv: list[str]) -> Call:
    positionals = [a for a in argv if not a.startswith("-")]
    flags: dict[str, list[str]] = {}
    for a in argv:
        if a.startswith("--"):
            key, _, value = a[2:].partition("=")
            flags.setdefault(key, []).append(value)
    verb_at = next((i for i, a in enumerate(positionals) if a in VERBS), None)
    if verb_at is None:
        raise SystemExit(f"gcloud stand-in: no known verb in {argv}")
    group, verb, rest = " ".join(positionals[:verb_at]), positionals[verb_at], positionals[verb_at + 1:]
    if group == "scheduler jobs" and verb in ("create", "update") and rest[:1] == ["pubsub"]:
        rest = rest[1:]
    name = rest[0] if rest else ""
    if group == "iam service-accounts":
        name = name.split("@")[0]
    if group == "firestore databases":
        name = (flags.get("database") or ["(default)"])[0]
    if group == "firestore indexes composite" and verb == "create":
        name = json.dumps([flags.get("collection-group", [""])[0], flags.get("field-config", [])])
    if group == "monitoring dashboards" and verb == "create":  # Cloud Monitoring names it; the stand-in by its title
        name = json.loads(_read(flags["config-from-file"][-1]))["displayName"]
    return Call(argv, group, verb, name, flags, rest)


def _value(resource: dict, fmt: str) -> str:
    m = re.fullmatch(r"value\((\w+)\)", fmt)
    if not m:
        return json.dumps(resource)
    value = resource.get(m.group(1), "")
    return str(value) if value not in (None, False) else ""


def standin(argv: list[str]) -> int:
    state_path, log_path = os.environ["STANDIN_STATE"], os.environ["STANDIN_LOG"]
    state = json.loads(_read(state_path)) if os.path.exists(state_path) else {}
    call = parse(argv)
    kind = state.setdefault(call.group, {})
    existed = call.name in kind and not kind[call.name].get("deleted")
    with open(log_path, "a") as log:
        log.write(json.dumps({"argv": argv, "group": call.group, "verb": call.verb, "name": call.name,
                              "existed": existed}) + "\n")
    rc, out, err = 0, "", ""
    flags = {k: v[-1] for k, v in call.flags.items()}
    if call.verb == "describe":
        if call.name in kind:
            out = _value(kind[call.name], flags.get("format", ""))
        else:
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.describe) NOT_FOUND: {call.name}"
    elif call.verb == "list":
        if call.group == "firestore indexes composite":
            out = json.dumps([{"name": f"projects/p/databases/(default)/collectionGroups/{json.loads(n)[0]}/indexes/i{i}",
                               "fields": r["fields"]} for i, (n, r) in enumerate(kind.items())])
        elif flags.get("format") == "value(name)":
            out = "\n".join(n for n, r in kind.items() if not r.get("deleted"))
        else:
            out = json.dumps(list(kind))
    elif call.verb == "create":
        if existed or call.name in kind:
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.create) ALREADY_EXISTS: {call.name}"
        else:
            kind[call.name] = {"flags": flags}
            if call.group == "firestore indexes composite":
                kind[call.name]["fields"] = [
                    {"fieldPath": c["field-path"], "order": c.get("order", "ascending").upper()}
                    for c in (dict(kv.split("=", 1) for kv in fc.split(",")) for fc in call.flags["field-config"])]
            if call.group == "logging sinks":
                kind[call.name]["writerIdentity"] = SINK_WRITER
    elif call.verb == "delete":
        kind.pop(call.name, None)
    elif call.verb == "cp":
        src, dst = call.positionals[0], call.positionals[1]
        if not os.path.isfile(src):
            rc, err = 1, f"ERROR: (gcloud.storage.cp) {src} not found"
        else:
            state.setdefault("storage objects", {})[dst] = {"size": os.path.getsize(src)}
    elif call.verb in ("update", "undelete") and call.group in ("iam roles", "logging sinks", "scheduler jobs") \
            and call.name not in kind:
        rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.{call.verb}) NOT_FOUND: {call.name}"
    elif call.verb == "undelete":
        kind[call.name]["deleted"] = False
    elif call.verb in ("add-iam-policy-binding", "add-invoker-policy-binding"):
        if call.group not in ("projects",) and call.name not in kind and call.group != "functions":
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.{call.verb}) NOT_FOUND: {call.name}"
        else:
            bindings = state.setdefault("bindings", [])
            entry = [call.group, call.name, flags.get("member", ""), flags.get("role", "roles/run.invoker")]
            if flags.get("condition-from-file"):  # a conditioned binding: the condition's expression goes with it
                if sys.flags.no_site:  # run with -S (tests/deploy_fixtures.py's wrapper): the venv's packages
                    import site

                    site.main()
                import yaml

                entry.append(yaml.safe_load(_read(flags["condition-from-file"]))["expression"])
            if entry not in bindings:
                bindings.append(entry)
    elif call.verb == "remove-iam-policy-binding":
        entry = [call.group, call.name, flags.get("member", ""), flags.get("role", "")]
        bindings = state.setdefault("bindings", [])
        if entry in bindings:  # --condition=None: the unconditioned binding only
            bindings.remove(entry)
        else:
            rc, err = 1, "ERROR: Policy binding with the specified principal, role, and condition not found!"
    else:  # deploy, update, enable, ttls update: create or update
        kind.setdefault(call.name, {})["flags"] = flags
    with open(state_path, "w") as f:
        f.write(json.dumps(state, indent=1))
    if out:
        print(out)
    if err:
        print(err, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(standin(sys.argv[1:]))
