"""Settings from `git config subtask.*`, with their defaults in one place.

Keys are given without the `subtask.` prefix (`config.get("maxRunning")`). The repository's
`subtask.*` settings are read once, by one `git config` process, when the first is asked for (git's
own reading: includes, conditional includes, worktree config, GIT_CONFIG_* in the environment).
The same process reads the settings git signs and verifies commits with (`user.signingKey`,
`gpg.*`: `config.git("gpg.format")`), so knowing that no key is configured costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from subtask.model.errors import SubtaskError


@dataclass(frozen=True)
class Setting:
    """A numeric or boolean `subtask.*` key: its default and what values make sense."""

    default: str
    kind: str  # "int" | "number" | "flag"
    minimum: float = 0.0
    meaning: str = ""


SETTINGS: dict[str, Setting] = {
    "maxRunning": Setting("4", "int", 1, "workers at once"),
    "maxDepth": Setting("2", "int", 1, "how deep jobs may start jobs"),
    "monthlyCapUsd": Setting("100", "number", 0, "monthly spend cap in USD"),
    "defaultMaxUsd": Setting("2", "number", 0, "a paid job's budget in USD"),
    "maxJobUsd": Setting("20", "number", 0, "the largest budget one job may reserve"),
    "verifyTimeout": Setting("600", "number", 1, "seconds verify may run"),
    "deleteLandedBranches": Setting("true", "flag"),
    "stopGrace": Setting("5", "number", 0, "seconds between SIGTERM and SIGKILL on stop"),
    "sweepInterval": Setting("30", "number", 0, "seconds between lazy landed-job sweeps"),
    "setupTimeout": Setting("600", "number", 1, "seconds `subtask.setup` may run"),
    "defaultTimeout": Setting("3600", "number", 0, "seconds a paid engine may run when no --timeout is given (0: no limit)"),
    "stallAfter": Setting("600", "number", 0, "seconds without an event from the engine after which a job is marked stalled (0: never)"),
    "refLockStale": Setting("10", "number", 1, "seconds after which a record's ref lock is a dead writer's leftover"),
    "portBase": Setting("20000", "int", 1, "the first port handed to running jobs ($SUBTASK_PORT)"),
    "portsPerJob": Setting("10", "int", 1, "consecutive ports each running job gets from $SUBTASK_PORT"),
    "packLooseObjects": Setting("1024", "int", 0, "loose objects added since the last pack that make a "
                                "worker pack them before its checkout (0: never)"),
}
# Word settings: the allowed words, the first one the default (a wrong word reads as the default).
CHOICES: dict[str, tuple[str, ...]] = {
    "stallAction": ("mark", "stop"),  # what follows a stall: mark the job, or stop its engine
}
DEFAULTS: dict[str, str] = {key: setting.default for key, setting in SETTINGS.items()}
DEFAULTS.update({key: words[0] for key, words in CHOICES.items()})
# subtask.sign: auto (sign when git has a signing key), always (refuse to start without one), never.
SIGN_MODES = ("auto", "always", "never")
FLAG_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


class Config:
    def __init__(self, reader: Callable[[str], str | None]):
        self._read = reader

    def get(self, key: str, default: str | None = None) -> str | None:
        value = self._read("subtask." + key)
        if value is None:
            return default if default is not None else DEFAULTS.get(key)
        return value

    def __call__(self, key: str) -> str | None:
        return self.get(key)

    def get_all(self, key: str) -> list[str]:
        """Every value of `subtask.<key>` (one of `MULTI_VALUED`), e.g. `isolation.socket`."""
        return self._read.every("subtask." + key) if isinstance(self._read, GitSettings) else (
            [v for v in [self._read("subtask." + key)] if v is not None])

    def git(self, key: str) -> str | None:
        """A setting outside `subtask.*` that `SETTINGS_ARGS` reads (`user.signingKey`, `user.name`,
        `user.email`, `gpg.*`)."""
        return self._read(key)

    def remember(self, key: str, value: str) -> None:
        """A `subtask.*` value this process just wrote with `git config`, read back from now on."""
        if isinstance(self._read, GitSettings):
            self._read.set(_canonical("subtask." + key), value)

    def sign_mode(self) -> str:
        """`subtask.sign` (auto, always, never); a value that is none of them reads as auto (doctor says so)."""
        return sign_mode_of(self.get("sign"))

    def signing_key(self) -> str | None:
        """The key git signs with (`user.signingKey`), unless `subtask.sign` is never."""
        return signing_key_of(self._read)

    def settings(self) -> dict[str, str] | None:
        """Every setting as git gave them (None when they do not come from git)."""
        return self._read.all() if isinstance(self._read, GitSettings) else None

    def number(self, key: str) -> float:
        value, problem = self._checked(key)
        if problem:
            raise SubtaskError("fatal", problem, hint=fix_hint(key))
        return value

    def integer(self, key: str) -> int:
        return int(self.number(key))

    def choice(self, key: str) -> str:
        """One of `CHOICES[key]`; the default for anything else (`problems` names it)."""
        value = (self.get(key) or "").strip().lower()
        return value if value in CHOICES[key] else CHOICES[key][0]

    def flag(self, key: str) -> bool:
        return (self.get(key) or "").strip().lower() in ("1", "true", "yes", "on")

    def problems(self) -> list[tuple[str, str]]:
        """(message, fix) for every known `subtask.*` setting whose value would be refused at use."""
        found = []
        for key, setting in SETTINGS.items():
            if setting.kind == "flag":
                raw = self.get(key) or ""
                if raw.strip().lower() not in FLAG_WORDS:
                    found.append((f"git config subtask.{key} is not true or false: {raw!r}", fix_hint(key)))
                continue
            problem = self._checked(key)[1]
            if problem:
                found.append((problem, fix_hint(key)))
        for key, words in CHOICES.items():
            raw = self.get(key) or ""
            if raw.strip().lower() not in words:
                found.append((f"git config subtask.{key} must be {' or '.join(words)}, not {raw!r} (read as {words[0]})",
                              f"git config subtask.{key} {words[0]}"))
        sign = self.get("sign")
        if sign is not None and sign.strip().lower() not in SIGN_MODES:
            found.append((f"git config subtask.sign is not auto, always or never: {sign!r}", "git config subtask.sign auto"))
        return found

    def _checked(self, key: str) -> tuple[float, str | None]:
        raw = self.get(key)
        setting = SETTINGS.get(key, Setting("", "number"))
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return 0.0, f"git config subtask.{key} is not a number: {raw!r}"
        if not math.isfinite(value) or value < setting.minimum:
            return 0.0, f"git config subtask.{key} must be a finite number >= {setting.minimum:g}, not {raw!r}"
        if setting.kind == "int" and value != int(value):
            return 0.0, f"git config subtask.{key} must be a whole number, not {raw!r}"
        return value, None


def sign_mode_of(value: str | None) -> str:
    value = (value or "auto").strip().lower()
    return value if value in SIGN_MODES else "auto"


def signing_key_of(read: Callable[[str], str | None]) -> str | None:
    """The signing key a reader of git settings names, unless `subtask.sign` is never: the one
    rule both the record writer (`Config`) and the notes writer (pygit2's config) follow."""
    if sign_mode_of(read("subtask.sign")) == "never":
        return None
    return (read("user.signingkey") or "").strip() or None


def fix_hint(key: str) -> str:
    setting = SETTINGS.get(key)
    what = f" ({setting.meaning})" if setting and setting.meaning else ""
    return f"git config subtask.{key} {DEFAULTS.get(key, 'N')}{what}"


class GitSettings:
    """A reader over every `subtask.*` setting git gave (`SETTINGS_ARGS`, `parse_settings`; the
    last value of a key wins, as in `git config --get`)."""

    def __init__(self, values: dict[str, str]):
        self._values = values

    def __call__(self, key: str) -> str | None:
        return self._values.get(_canonical(key))

    def every(self, key: str) -> list[str]:
        """Every value of a `MULTI_VALUED` key, in the order git gave them."""
        kept = self._values.get(_ALL + _canonical(key))
        return kept.split("\0") if kept is not None else []

    def all(self) -> dict[str, str]:
        return self._values  # `_ALL` keys too: a worker forked with them reads what we read

    def set(self, key: str, value: str) -> None:
        self._values[key] = value


# Every `subtask.*` setting, and those git signs commits with (one process reads them all).
SETTINGS_ARGS = ("config", "-z", "--get-regexp", r"^(subtask|gpg)\.|^user\.(signingkey|name|email)$")


# Keys that may be given many times (`git config --add`): every value is kept, for `get_all`.
MULTI_VALUED = ("subtask.isolation.writable", "subtask.isolation.readable", "subtask.isolation.socket",
                "subtask.isolation.env")
_ALL = "\0all:"  # the prefix of the key under which a multi-valued key's values are kept, NUL-separated


def parse_settings(out: bytes) -> dict[str, str]:
    """`git config -z --get-regexp` output as {key: last value} (and every value of a
    `MULTI_VALUED` key under `_ALL` + key)."""
    values: dict[str, str] = {}
    for item in out.decode("utf-8", "surrogateescape").split("\0"):
        key, _, value = item.partition("\n")
        if key:
            values[key] = value
            if key in MULTI_VALUED:
                kept = values.get(_ALL + key)
                values[_ALL + key] = value if kept is None else kept + "\0" + value
    return values


def _canonical(key: str) -> str:
    """A key as git prints it: section and name lower-cased, a subsection as written."""
    section, _, rest = key.partition(".")
    middle, _, name = rest.rpartition(".")
    return ".".join(part for part in (section.lower(), middle, name.lower()) if part)
