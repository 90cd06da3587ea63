"""Print the `gcloud firestore indexes composite create` arguments of each wanted index that does not exist yet.

    gcloud firestore indexes composite list --format=json | python3 -m deploy.firestore_indexes WANTED.json

WANTED.json is deploy/render.py's indexes.json. Output: one line per missing index, shell-quoted arguments.
Standard library only: it runs in the Cloud SDK image.
"""

from __future__ import annotations

import json
import shlex
import sys


def _key(collection_group: str, fields: list[tuple[str, str]]) -> tuple:
    return collection_group, tuple((f, o.upper()) for f, o in fields if f != "__name__")


def listed_key(ix: dict) -> tuple:
    """The key of a listed Index resource (Firestore Admin v1): its collection group and its fields but `__name__`,
    each with its order or array config."""
    # name: projects/P/databases/(default)/collectionGroups/GROUP/indexes/ID
    group = ix.get("name", "").split("/collectionGroups/")[-1].split("/")[0]
    fields = [(f.get("fieldPath", ""), f.get("order") or f.get("arrayConfig") or "") for f in ix.get("fields", [])]
    return _key(group, fields)


def existing_keys(listed: list[dict]) -> set[tuple]:
    return {listed_key(ix) for ix in listed}


def wanted_key(ix: dict) -> tuple:
    fields = []
    for config in ix["field_config"]:
        parts = dict(p.split("=", 1) for p in config.split(","))
        fields.append((parts["field-path"], parts.get("order", "ascending")))
    return _key(ix["collection_group"], fields)


def create_args(ix: dict) -> list[str]:
    """The `gcloud firestore indexes composite create` arguments of a wanted index (deploy/render.py's indexes())."""
    return [f"--collection-group={ix['collection_group']}", *(f"--field-config={c}" for c in ix["field_config"])]


def missing(wanted: list[dict], listed: list[dict]) -> list[list[str]]:
    have = existing_keys(listed)
    return [create_args(ix) for ix in wanted if wanted_key(ix) not in have]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        wanted = json.load(f)
    text = sys.stdin.read().strip()
    for args in missing(wanted, json.loads(text) if text else []):
        print(" ".join(shlex.quote(a) for a in args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
