"""Config validation for the Snakefile and the CLI: one line that names the key and the allowed values.

Snakemake's own `validate` also fills in the schema defaults, so it runs after our check; our check only exists to
turn jsonschema's best-matching error into a message a user can act on before any job starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import jsonschema
import yaml

from gradfidelity.errors import UserError


def validate_section(section: dict, schema_path: str | Path, where: str) -> dict:
    schema = yaml.safe_load(Path(schema_path).read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(section))
    if error is not None:
        path = [where, *error.absolute_path]
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set(error.schema.get("properties", {}))
            path.append(",".join(sorted(k for k in error.instance if k not in known)))
        key = ".".join(str(p) for p in path if p != "")
        allowed = error.schema.get("enum") if isinstance(error.schema, dict) else None
        hint = f" (allowed: {', '.join(map(str, allowed))})" if allowed else ""
        raise UserError(f"bad config key '{key}' ({schema_path}): {error.message}{hint}")
    from snakemake.utils import validate  # fills defaults in place

    validate(section, str(schema_path))
    return section


def cfg_from_json(text: str, where: str, option: str = "--cfg") -> dict:
    """A JSON-object argument of a rule's command: `--cfg` (the config keys a job reads, its study's
    rules.JOB_KEYS) or `--cell` (the job's wildcards)."""
    import json

    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: {option} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: {option} must be a JSON object, got {type(cfg).__name__}")
    return cfg


def _types(schema: dict) -> set[str]:
    t = schema.get("type", [])
    return {t} if isinstance(t, str) else set(t)


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref", "")
    if ref.startswith("#/"):
        node = root
        for part in ref[2:].split("/"):
            node = node[part]
        return _resolve(node, root)
    return schema


def coerce_cli_strings(value, schema: dict, where: str, root: dict | None = None):
    """Undo the string-only parsing of nested `--config key='{...}'` values, guided by the schema.

    Snakemake parses a nested command-line value with YAML's BaseLoader, which keeps every scalar a string
    (steps: "10"). Where the schema wants a number or a boolean and finds a string, the string is read as YAML;
    if it still is not of the wanted type, the schema check that follows names the key.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: coerce_cli_strings(v, props.get(k, extra if isinstance(extra, dict) else {}), f"{where}.{k}",
                                      root) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [coerce_cli_strings(v, items, where, root) for v in value]
    if isinstance(value, str) and _types(schema) & {"integer", "number", "boolean", "null"} \
            and "string" not in _types(schema):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        if isinstance(parsed, str) and "number" in _types(schema):
            try:  # YAML 1.1 reads "3e-4" (no dot) as a string
                return float(parsed)
            except ValueError:
                return value
        return parsed if not isinstance(parsed, (dict, list, str)) else value
    return value


# ---------------------------------------------------------------------------------------------- the typed spine
# Every study's `config.py` is a tree of frozen dataclasses built by `build` from a validated section: no per-class
# `from_dict`. The schema (workflow/schemas/<study>.schema.yaml) is the one place for types, enums and defaults;
# a dataclass field keeps a default only where the schema has none, and `schema_mismatches` (run by the tests)
# says where the two disagree. Cross-field checks live in each dataclass's `__post_init__`, raising UserError with
# the key, so they run when the workflow loads the config (common.smk builds every study's config once).

SCHEMAS = Path(__file__).resolve().parents[2] / "workflow" / "schemas"


def _convert(tp, value, where: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"bad config key '{where}': expected a mapping, got {value!r}")
        return build(tp, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise UserError(f"bad config key '{where}': expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        return tuple(value)
    if origin is list:
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"bad config key '{where}': expected a mapping, got {value!r}")
        vt = args[1] if len(args) == 2 else typing.Any
        return {k: _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # YAML's 1 for a float key
    if tp in (int, float, str, bool) and not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise UserError(f"bad config key '{where}': expected {tp.__name__}, got {value!r}")
    return value


def build(cls, data: dict, where: str):
    """A frozen dataclass tree from a (validated) config mapping: the one builder of every study's config.

    Nested dataclasses, `tuple[X, ...]`, `dict[str, X]` and `X | None` are followed from the type hints. An unknown
    key, a missing key without a default, or a value of the wrong type raises UserError naming the key
    (`where.key`), before any work. A field typed `X | None` that is absent is None: a job that was not given a
    section (the rules pass each job only the sections it reads) fails loudly if it reads it.
    """
    if not isinstance(data, dict):
        raise UserError(f"bad config key '{where}': expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"bad config key '{where}.{unknown[0]}': unknown (allowed: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            origin = typing.get_origin(hints[name])
            if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hints[name]):
                kwargs[name] = None
            else:
                raise UserError(f"bad config key '{key}': missing")
    return cls(**kwargs)


def load(cls, data: dict, study: str, where: str | None = None):
    """`build` after the study's schema check: the CLI's entry to a typed config. The schema fills its defaults
    (the one place they live) and names a bad key; `build` then makes the dataclass tree."""
    import copy

    section = validate_section(copy.deepcopy(data), SCHEMAS / f"{study}.schema.yaml", where or study)
    return build(cls, section, where or study)


def schema_mismatches(cls, schema: dict, where: str = "", root: dict | None = None) -> list[str]:
    """Where a dataclass tree and its JSON schema disagree: a key in one and not the other, or a default in both
    (a default lives in the schema only). Empty when they agree. Used by each study's config test."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    props = schema.get("properties", {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    out = [f"{where}.{k}: in the schema, not in {cls.__name__}" for k in sorted(set(props) - set(fields))]
    out += [f"{where}.{k}: in {cls.__name__}, not in the schema" for k in sorted(set(fields) - set(props))]
    for name in sorted(set(props) & set(fields)):
        f, p = fields[name], _resolve(props[name], root)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if "default" in p and has_default:
            out.append(f"{where}.{name}: a default in both the schema and {cls.__name__}")
        tp = hints[name]
        union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        for sub in (typing.get_args(tp) if union else (tp,)):
            if dataclasses.is_dataclass(sub):
                out += schema_mismatches(sub, p, f"{where}.{name}", root)
            elif typing.get_origin(sub) is dict and typing.get_args(sub) and \
                    dataclasses.is_dataclass(typing.get_args(sub)[1]):
                node = p.get("additionalProperties")
                if isinstance(node, dict):  # dict[str, Dataclass]: each value follows the schema's value schema
                    out += schema_mismatches(typing.get_args(sub)[1], _resolve(node, root), f"{where}.{name}", root)
    return out
