"""The exception hierarchy: every error the planner raises on bad input is a PlannerError."""

__all__ = ["PlannerError", "SpecError", "CatalogError", "ConfigImportError", "InvalidLayout"]


class PlannerError(Exception):
    """Base class: bad input or an impossible request, with a one-line message."""


class SpecError(PlannerError, ValueError):
    """A model, cluster or training spec breaks a rule (names the field and the rule)."""

    def __init__(self, message: str, field: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule


class CatalogError(PlannerError, LookupError):
    """A catalog id or file could not be found or read."""


class ConfigImportError(PlannerError, ValueError):
    """A Hugging Face config.json is malformed or of an unsupported architecture."""


class InvalidLayout(PlannerError, ValueError):
    """A parallel layout breaks a divisibility or product rule; the message shows the arithmetic."""
