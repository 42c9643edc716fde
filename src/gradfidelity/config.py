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
        key = ".".join(str(p) for p in [where, *error.absolute_path] if p != "")
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
