"""Generate kubeconform's JSON schemas offline from Kubernetes' OpenAPI v3 spec and CRDs.

kubeconform looks a resource's schema up by a path template. This writes the layout of its
default (the yannh/kubernetes-json-schema fork), so `-schema-location DIR` finds them:

    DIR/v<k8s version>-standalone-strict/<kind>-<group prefix>-<version>.json   (built-in kinds)
    DIR/crds/<group>/<kind>_<version>.json                                        (CRDs)

"standalone": every schema carries the definitions it uses (no outside references).
"strict": objects with declared properties refuse unknown keys, as the API server's strict
field validation does. Optional fields accept null, as the API server does.

Usage:
    k8s_schemas.py openapi --spec-dir K8S/api/openapi-spec/v3 --version 1.36.3 --out DIR
    k8s_schemas.py crd --out DIR/crds CRD.yaml...
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "convert_crd",
    "convert_openapi",
    "crd_schemas",
    "kind_file_name",
    "main",
    "openapi_schemas",
]

_REF_PREFIX = "#/components/schemas/"
_DRAFT4 = "http://json-schema.org/draft-04/schema#"
# Kinds of the meta API (Status, WatchEvent, DeleteOptions, ...) are not manifests anyone
# applies, and each claims dozens of group-versions.
_SKIP_PREFIX = "io.k8s.apimachinery.pkg.apis.meta."

Schema = dict[str, Any]


def kind_file_name(kind: str, api_version: str) -> str:
    """The file name kubeconform asks for: `deployment-apps-v1.json`, `service-v1.json`."""
    group, _, version = api_version.rpartition("/")
    if not group:
        return f"{kind.lower()}-{version.lower()}.json"
    return f"{kind.lower()}-{group.split('.')[0].lower()}-{version.lower()}.json"


def _api_version(gvk: Mapping[str, str]) -> str:
    return f"{gvk['group']}/{gvk['version']}" if gvk.get("group") else gvk["version"]


def _ref_name(ref: str) -> str:
    if not ref.startswith(_REF_PREFIX):
        raise ValueError(f"unsupported $ref {ref!r}: only {_REF_PREFIX}* is resolved")
    return ref[len(_REF_PREFIX) :]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield _ref_name(value)
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _closure(name: str, schemas: Mapping[str, Schema]) -> list[str]:
    """Every schema name reachable from `name` (itself excluded), sorted."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for ref in _refs(schemas[todo.pop()]):
            if ref not in seen and ref != name:
                if ref not in schemas:
                    raise ValueError(f"{name}: $ref to missing schema {ref!r}")
                seen.add(ref)
                todo.append(ref)
    return sorted(seen)


def _allow_null(schema: Schema, *, wrap: bool) -> Schema:
    """Accept null besides the schema: widen a plain `type`, else (when `wrap`) add a branch.

    Optional fields get only the widening, so a field typed by a reference stays strict and
    its errors stay readable; `nullable: true` gets the branch too.
    """
    if isinstance(schema.get("type"), str):
        out = dict(schema, type=[schema["type"], "null"])
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    return {"anyOf": [{"type": "null"}, schema]} if wrap else schema


def _tighten(node: Any, *, ref_base: str) -> Any:
    """Rewrite one schema tree: strict objects, nullable optional fields, local refs."""
    if isinstance(node, list):
        return [_tighten(item, ref_base=ref_base) for item in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key == "description" or (key.startswith("x-kubernetes-") and key not in _KEEP_X):
            continue
        if key == "$ref" and isinstance(value, str):
            out[key] = ref_base + _ref_name(value)
        elif key == "properties" and isinstance(value, dict):
            required = set(node.get("required", ()))
            props = {k: _tighten(v, ref_base=ref_base) for k, v in value.items()}
            out[key] = {
                k: v if k in required else _allow_null(v, wrap=False) for k, v in props.items()
            }
        else:
            out[key] = _tighten(value, ref_base=ref_base)
    if out.get("format") == "int-or-string":
        del out["format"]
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if out.pop("nullable", False):
        out = _allow_null(out, wrap=True)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


_KEEP_X = frozenset({"x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"})


def _pin_kind(schema: Schema, kind: str, api_version: str) -> Schema:
    props = schema.get("properties", {})
    for field, value in (("kind", kind), ("apiVersion", api_version)):
        if field in props:
            props[field] = {"type": "string", "enum": [value]}
    return schema


def openapi_schemas(spec_docs: Iterable[Mapping[str, Any]]) -> dict[str, Schema]:
    """Built-in kinds as `{file name: schema}` from OpenAPI v3 documents (one per group-version)."""
    schemas: dict[str, Schema] = {}
    for spec in spec_docs:
        for name, schema in spec.get("components", {}).get("schemas", {}).items():
            schemas.setdefault(name, schema)
    out: dict[str, Schema] = {}
    for name in sorted(schemas):
        gvks = schemas[name].get("x-kubernetes-group-version-kind", ())
        if name.startswith(_SKIP_PREFIX) or not gvks:
            continue
        defs = {
            ref: _tighten(schemas[ref], ref_base="#/definitions/")
            for ref in _closure(name, schemas)
        }
        if name in _refs(schemas[name]):  # self-referencing kind: keep it reachable
            defs[name] = _tighten(schemas[name], ref_base="#/definitions/")
        for gvk in gvks:
            api_version = _api_version(gvk)
            root = _pin_kind(
                _tighten(schemas[name], ref_base="#/definitions/"), gvk["kind"], api_version
            )
            doc: Schema = {"$schema": _DRAFT4, **root}
            if defs:
                doc["definitions"] = defs
            out.setdefault(kind_file_name(gvk["kind"], api_version), doc)
    return out


def crd_schemas(documents: Iterable[Any]) -> dict[str, Schema]:
    """CRD versions as `{"<group>/<kind>_<version>.json": schema}`."""
    out: dict[str, Schema] = {}
    for crd in documents:
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        kind, group = spec["names"]["kind"], spec["group"]
        for version in spec.get("versions", ()):
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if schema is None:
                continue
            api_version = f"{group}/{version['name']}"
            doc = _pin_kind(_tighten(schema, ref_base="#/definitions/"), kind, api_version)
            out[f"{group}/{kind.lower()}_{version['name']}.json"] = {"$schema": _DRAFT4, **doc}
    return out


def _write(files: Mapping[str, Schema], out_dir: Path) -> None:
    for rel, schema in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")


def convert_openapi(spec_dir: Path, version: str, out: Path) -> int:
    """Write `out/v<version>-standalone-strict/*.json`; returns the number of files."""
    specs = sorted(spec_dir.glob("*_openapi.json"))
    if not specs:
        raise FileNotFoundError(
            f"{spec_dir}: no *_openapi.json files (expected api/openapi-spec/v3)"
        )
    files = openapi_schemas(json.loads(p.read_text()) for p in specs)
    _write(files, out / f"v{version.removeprefix('v')}-standalone-strict")
    return len(files)


class _CrdLoader(yaml.SafeLoader):
    """SafeLoader that reads a bare `=` (YAML 1.1's value tag, found in CRD enums) as text."""


_CrdLoader.add_constructor(
    "tag:yaml.org,2002:value",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def convert_crd(paths: Iterable[Path], out: Path) -> int:
    """Write `out/<group>/<kind>_<version>.json` for every CRD in the files."""
    files: dict[str, Schema] = {}
    for path in paths:
        files.update(crd_schemas(yaml.load_all(path.read_text(), Loader=_CrdLoader)))
    _write(files, out)
    return len(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    api = sub.add_parser("openapi", help="built-in kinds from api/openapi-spec/v3")
    api.add_argument("--spec-dir", type=Path, required=True)
    api.add_argument("--version", required=True, help="Kubernetes version, e.g. 1.36.3")
    api.add_argument("--out", type=Path, required=True)
    crd = sub.add_parser("crd", help="CustomResourceDefinition YAML files")
    crd.add_argument("--out", type=Path, required=True)
    crd.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "openapi":
        count = convert_openapi(args.spec_dir, args.version, args.out)
    else:
        count = convert_crd(args.files, args.out)
    print(f"k8s_schemas: wrote {count} schemas under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
