"""Errors a user can fix. The CLI prints them as one line and exits with code 2, before any work starts."""


class UserError(Exception):
    """A bad config value, a missing or corrupt input file: the message names the key or the path."""
