#!/usr/bin/env python3
"""Bundles the Matrix Client-Server API (one OpenAPI file per area, with relative `$ref`s into
`definitions/` and the event schemas) into one self-contained OpenAPI document for schemathesis.

Usage: bundle_spec.py SPEC_DIR OUT.json
  SPEC_DIR  matrix-spec's data/api/client-server directory

Each file's paths are prefixed with its `basePath` server variable (`/_matrix/client/v3`, ...);
every `$ref` is inlined (a reference back into a schema being inlined becomes `{}`, so
recursive schemas stay finite).
"""

import json
import os
import sys

import yaml

_files = {}


def load(path):
    if path not in _files:
        with open(path, encoding="utf-8") as f:
            _files[path] = yaml.safe_load(f)
    return _files[path]


def follow(doc, pointer):
    for part in [p for p in pointer.split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def inline(node, path, stack=()):
    if isinstance(node, list):
        return [inline(item, path, stack) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and isinstance(node["$ref"], str):
        target, _, pointer = node["$ref"].partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        key = (target, pointer)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if key in stack:
            return inline(siblings, path, stack)
        resolved = inline(follow(load(target), pointer), target, stack + (key,))
        if isinstance(resolved, dict):
            resolved = {**resolved, **inline(siblings, path, stack)}
        return resolved
    return {k: inline(v, path, stack) for k, v in node.items()}


def main(spec_dir, out):
    paths, schemes = {}, {}
    for name in sorted(os.listdir(spec_dir)):
        path = os.path.join(spec_dir, name)
        if not name.endswith(".yaml") or not os.path.isfile(path):
            continue
        doc = load(path)
        if not isinstance(doc, dict) or "paths" not in doc:
            continue
        base = ""
        for server in doc.get("servers") or []:
            base = server.get("variables", {}).get("basePath", {}).get("default", base)
        for route, item in (doc.get("paths") or {}).items():
            paths.setdefault(base + route, {}).update(inline(item, path))
        schemes.update(inline((doc.get("components") or {}).get("securitySchemes") or {}, path))
    bundle = {
        "openapi": "3.1.0",
        "info": {"title": "Matrix Client-Server API (bundled)", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": schemes},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(bundle, f)
    print(f"{out}: {len(paths)} paths", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
