"""What git says of one commit's signature, as data: the words `show`, the note and `verify` use.

Here, not in `git/signing.py`, so that a reading command shows an unsigned record without
importing the code that asks git about signatures.
"""

from __future__ import annotations

from subtask.model.dataclass import dataclass

TYPE_CHECKING = False  # not `typing`'s: a reading command never imports typing (tests/test_imports.py)
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class Provenance:
    """What git says of one commit's signature, here."""

    status: str  # unsigned | good | untrusted | bad | expired | revoked | unverifiable
    signer: str = ""  # the principal (ssh: from the allowed-signers file) or the key's user id
    key: str = ""  # the key's fingerprint
    trust: str = ""  # git's trust level (%GT)

    @property
    def trusted(self) -> bool:
        return self.status == "good"

    @property
    def signed(self) -> bool:
        return self.status != "unsigned"

    def to_dict(self) -> dict[str, Any]:
        return {"v": 1, "status": self.status, "trusted": self.trusted, "signer": self.signer, "key": self.key}

    def words(self) -> str:
        """One phrase, as `show`, the note and `verify` say it."""
        key = f" ({self.key})" if self.key else ""
        if self.status == "good":
            return f"signed by {self.signer or 'an allowed signer'}{key}, an allowed signer"
        if self.status == "untrusted":
            return (f"signed{key} by a key that is not an allowed signer here "
                    "(gpg.ssh.allowedSignersFile, or the keyring)")
        if self.status == "bad":
            return f"a BAD signature{key}: the record was changed after it was signed"
        if self.status in ("expired", "revoked"):
            return f"signed{key} by a key that is {self.status}"
        if self.status == "unverifiable":
            return f"signed{key}, but git cannot check it here (set gpg.ssh.allowedSignersFile, or import the key)"
        return "not signed"


UNSIGNED = Provenance("unsigned")
