"""Config validation for the Snakefile and the CLI: one line that names the key and the allowed values.

Snakemake's own `validate` also fills in the schema defaults, so it runs after our check; our check only exists to
turn jsonschema's best-matching error into a message a user can act on before any job starts.
"""

from __future__ import annotations

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


def cfg_from_json(text: str, where: str) -> dict:
    """The `--cfg` argument every rule passes (one study's config section as JSON, from `study_cfg`)."""
    import json

    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: --cfg is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: --cfg must be a JSON object, got {type(cfg).__name__}")
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
