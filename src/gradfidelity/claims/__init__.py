"""The claims registry and the verdicts computed from results."""

from gradfidelity.claims.verify import VERDICTS, load_registry, verify

__all__ = ["VERDICTS", "load_registry", "verify"]
