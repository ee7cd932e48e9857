"""The one error type the protocol raises, with a machine-readable reason."""


class ProtocolError(ValueError):
    """A payload that does not follow the protocol.

    ``reason`` is a short stable token (used as a metrics label), ``detail`` the human message
    that names the field and what is wrong with it.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
