"""Secret redaction for everything git-subtask stores or shows: logs, events, summaries, notes.

This module owns the list of secret shapes and the single replacement marker `[REDACTED]`.

Invariants:
- Idempotent: `redact(redact(x)) == redact(x)`; the marker itself matches no pattern.
- Names survive, values do not: `password=hunter2` becomes `password=[REDACTED]`, quoted values
  keep their quotes (`"token": "[REDACTED]"`) so redacted JSON text stays JSON where it was.
- Linear time: every pattern is compiled once (on first use, `lazyre.compile`), anchored on a
  literal prefix or a word start, and every repetition that could backtrack is bounded.
- Ordinary text is left alone: git shas, words such as "tokenizer" or "max_tokens", prose that
  mentions a secret without assigning one.
- Exact values of secret-looking environment variables (default `os.environ`) are redacted
  wherever they appear, because no pattern can recognise an arbitrary password.
- Never redact a stream one line at a time, because a private key spans lines and a token can
  span reads: streams pass one `redact.StreamRedactor` each (`procs.run(redact=True)`, the
  worker's event sink), and summaries and tails are built from what it released.
- Never build a `StreamRedactor` per event (`dict.setdefault(key, StreamRedactor())` builds one
  every call), because each one reads the environment's secret values: a 5 MB job took 47 s.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping

from subtask.model import lazyre

TYPE_CHECKING = False  # not `typing`'s (~3 ms to import): only a type checker reads what it guards
if TYPE_CHECKING:
    from typing import Any

MARKER = "[REDACTED]"

# -- token shapes: replaced whole ---------------------------------------------------------------

# Word-start guard: the token must not be the tail of a longer identifier.
_START = r"(?<![A-Za-z0-9_-])"
_END = r"(?![A-Za-z0-9_-])"

_TOKENS = [
    # PEM private keys, whole block. The body may not contain "-----", so a BEGIN without an END
    # stops scanning at the next armor line instead of running on: linear time.
    lazyre.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?:[^-]|-(?!----)){0,16384}"
               r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----"),
    # A private key cut short (e.g. by a log tail): its BEGIN line and the base64 that follows,
    # also when newlines are JSON-escaped ("\\n").
    lazyre.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----[A-Za-z0-9+/=\r\n\t \\]{0,16384}"),
    # Anthropic (sk-ant-...) and OpenAI (sk-..., sk-proj-...) keys.
    lazyre.compile(_START + r"sk-[A-Za-z0-9_-]{20,}"),
    # GitHub tokens, classic and fine-grained.
    lazyre.compile(_START + r"gh[pousr]_[A-Za-z0-9]{20,}" + _END),
    lazyre.compile(_START + r"github_pat_[A-Za-z0-9_]{20,}"),
    # AWS access key ids.
    lazyre.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    # Google API keys.
    lazyre.compile(_START + r"AIza[0-9A-Za-z_-]{35}" + _END),
    # Slack tokens.
    lazyre.compile(_START + r"xox[baprs]-[0-9A-Za-z-]{10,}"),
    # JSON Web Tokens: header.payload.signature, the header being base64 of '{"'.
    lazyre.compile(_START + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
]

# The armor lines of a private key, for the stream state and for a block cut off at its start.
_PEM_BEGIN = lazyre.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PEM_END = lazyre.compile(r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----")
# A line of a key's body: base64, or an RFC 1421 header (Proc-Type, DEK-Info), or blank.
_PEM_BODY_LINE = lazyre.compile(
    r"[ \t]*(?:[A-Za-z0-9+/=]{1,256}|Proc-Type:[^\n]{0,200}|DEK-Info:[^\n]{0,200})?[ \t\r]*")

# Replaced keeping a non-secret prefix (group 1).
_PREFIXED = [
    # Slack incoming webhooks: the path is the credential.
    lazyre.compile(r"(https://hooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9_/-]+"),
    # HTTP bearer tokens.
    lazyre.compile(r"(?i)(\bbearer[ \t]+)[A-Za-z0-9._~+/=-]{16,}"),
    # Authorization headers of any scheme (Basic, Token, Digest, none): the scheme is kept, the
    # credentials go to the end of the line or the quoted value.
    lazyre.compile(r"(?i)(\b(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?(?![A-Za-z]{1,20}[ \t]+\[)"
               r"(?:(?:basic|token|digest|bearer|negotiate|ntlm|apikey|key)[ \t]+)?)"
               r"(?!\[REDACTED\])[^\s\"'][^\n\"']{5,4096}"),
    # Credentials in URLs: scheme://user:password@host.
    lazyre.compile(r"(://[^/\s:@]{1,256}:)[^/\s@]{1,256}(?=@)"),
    # `.netrc`'s `password X` (no `=`): after `machine`/`login`/`account NAME` or `default` on its
    # line, or alone on a line with its value (the file spread over lines). Prose ("your login
    # name and password") has neither shape.
    lazyre.compile(r"(?im)(^[ \t]*(?:(?:(?:machine|login|account)[ \t]+\S{1,256}[ \t]+|default[ \t]+){1,8}"
               r"password[ \t]+(?!\[REDACTED\])|password[ \t]+(?!\[REDACTED\])"
               r"(?=\S{1,4096}[ \t]*(?:$|(?:machine|login|account|default)[ \t]))))\S{1,4096}"),
]

# -- assignments: name kept, value replaced ------------------------------------------------------

# The keyword that ends a secret's name: password, DB_PASSWORD, aws_secret_access_key, x-api-key,
# spring.datasource.password. Only the keyword and what follows are matched (the rest of the name
# is kept anyway), so the scan is linear. Requiring the separator right after the keyword keeps
# "tokenizer", "max_tokens" and "token_count" out.
_SECRET_KEYWORD = (
    r"(?:password|passwd|passphrase|token|secret|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|credentials?)"
)
_ASSIGNMENT = lazyre.compile(
    r"(?P<name>" + _SECRET_KEYWORD + r")"
    r"(?P<sep>[\"']?[ \t]*(?::=|[:=])(?!=)[ \t]*)"  # closing quote of a JSON/YAML key, then = or :
    r"(?P<value>\"(?:[^\"\\\n]|\\.){0,4096}\"|'[^'\n]{0,4096}'"
    r"|[\"']?[^\s\"'`,;&)\]}]{1,4096})",  # unquoted, or a quote never closed (a cut-off line)
    re.IGNORECASE,
)
_SECRET_KEY = lazyre.compile(_SECRET_KEYWORD + r"\Z", re.IGNORECASE)  # dict keys, in redact_obj
# Values that are plainly not secrets: JSON/YAML literals (redacting them would only break the
# document) and the type in a code annotation such as `password: str`.
_NOT_A_VALUE = frozenset({"null", "none", "true", "false", "nil", "undefined",
                          "str", "string", "bytes", "int", "bool"})


def _redact_assignment(match: re.Match[str]) -> str:
    value = match.group("value")
    if (value.lower() in _NOT_A_VALUE or value.startswith("$")  # $VAR names a secret, isn't one
            or value.lstrip("\"'").startswith(MARKER[:-1])):  # already redacted: stay idempotent
        return match.group(0)
    opening = value[0] if value[0] in "\"'" else ""
    closing = opening if len(value) >= 2 and value.endswith(opening) else ""
    return f"{match.group('name')}{match.group('sep')}{opening}{MARKER}{closing}"


# -- environment values ---------------------------------------------------------------------------

# AUTH but not AUTHOR: GIT_AUTHOR_NAME holds a person's name, which logs must keep. A socket's
# path is not a secret either (SSH_AUTH_SOCK): a confined job's evidence names the one it tried.
_SECRET_ENV_NAME = lazyre.compile(
    r"^(?!.*_SOCK(?:ET)?$).*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH(?!OR))", re.IGNORECASE)
_MIN_ENV_VALUE = 8


def _secret_env_values(env: Mapping[str, str]) -> frozenset[str]:
    return frozenset(
        value for name, value in env.items()
        if _SECRET_ENV_NAME.search(name) and len(value) >= _MIN_ENV_VALUE
        and value not in MARKER  # replacing part of the marker would break idempotence
    )


@functools.lru_cache(maxsize=32)
def _env_pattern(values: frozenset[str]) -> re.Pattern[str] | None:
    if not values:
        return None
    # Longest first, so a value containing another is replaced whole.
    ordered = sorted(values, key=lambda v: (-len(v), v))
    return re.compile("|".join(re.escape(v) for v in ordered))


def _env_redactor(env: Mapping[str, str] | None) -> re.Pattern[str] | None:
    return _env_pattern(_secret_env_values(os.environ if env is None else env))


# -- public API -----------------------------------------------------------------------------------


# What each pattern cannot match without (a cheap `in` test first: a pattern that begins with a
# lookbehind or an alternation is tried at every position, ~1.5 ms per 64 KiB each). Case-
# sensitive needles for _TOKENS, lower-case ones (tested on the lowered text) for the rest.
_TOKEN_NEEDLES = (("-----BEGIN",), ("-----BEGIN",), ("sk-",), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
                  ("github_pat_",), ("AKIA", "ASIA"), ("AIza",), ("xox",), ("eyJ",))
_PREFIXED_NEEDLES = (("hooks.slack.com",), ("bearer",), ("authorization",), ("://",), ("password",))
_ASSIGNMENT_NEEDLES = ("pass", "token", "secret", "api", "access", "private", "credential")


def _redact_with(text: str, env_pattern: re.Pattern[str] | None) -> str:
    for needles, pattern in zip(_TOKEN_NEEDLES, _TOKENS, strict=True):
        if any(n in text for n in needles):
            text = pattern.sub(MARKER, text)
    if "-----END" in text:
        text = _redact_orphan_ends(text)
    lowered = text.lower()  # the substitutions above add no needle: one lowering serves
    for needles, pattern in zip(_PREFIXED_NEEDLES, _PREFIXED, strict=True):
        if any(n in lowered for n in needles):
            text = pattern.sub(lambda m: m.group(1) + MARKER, text)
    if any(n in lowered for n in _ASSIGNMENT_NEEDLES):
        text = _ASSIGNMENT.sub(_redact_assignment, text)
    if env_pattern is not None:
        text = env_pattern.sub(MARKER, text)
    return text


def _redact_orphan_ends(text: str) -> str:
    """A key whose BEGIN line was cut off (a tail that starts inside it): the body lines right
    above its END line go with it. Each walk back stops at the previous END: linear time."""
    out = []
    done = 0  # text[:done] is settled
    for match in _PEM_END.finditer(text):
        start = match.start()
        line_start = max(text.rfind("\n", done, start) + 1, done)
        if not text[line_start:start].strip():
            start = line_start
            while start > done:
                above = max(text.rfind("\n", done, start - 1) + 1, done)
                if not _PEM_BODY_LINE.fullmatch(text, above, start - 1):
                    break
                start = above
        out += [text[done:start], MARKER]
        done = match.end()
    out.append(text[done:])
    return "".join(out)


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Return `text` with every recognised secret replaced by `[REDACTED]`."""
    if not text:
        return text
    return _redact_with(text, _env_redactor(env))


def redact_obj(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """Return a copy of `obj` with every string in it (through dicts, lists, tuples) redacted.

    Dict keys are kept; a string value under a secret-looking key ("password", "api_key") is
    replaced whole, as `redact` would do to the same pair written as `"password": "..."`.
    """
    return _redact_obj(obj, _env_redactor(env))


class Redactor:
    """`redact` and `redact_obj` with the environment's secret values read once, for a caller
    that redacts many small texts (an event per line of output) in an environment that stays."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self._env_pattern = _env_redactor(env)

    def text(self, text: str) -> str:
        return _redact_with(text, self._env_pattern) if text else text

    def obj(self, obj: Any) -> Any:
        return _redact_obj(obj, self._env_pattern)


def _redact_obj(obj: Any, env_pattern: re.Pattern[str] | None) -> Any:
    if isinstance(obj, str):
        return _redact_with(obj, env_pattern) if obj else obj
    if isinstance(obj, Mapping):
        return {key: _redact_item(key, value, env_pattern) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_redact_obj(item, env_pattern) for item in obj]
    if isinstance(obj, tuple):
        return tuple(_redact_obj(item, env_pattern) for item in obj)
    return obj


def _redact_item(key: Any, value: Any, env_pattern: re.Pattern[str] | None) -> Any:
    if (isinstance(key, str) and isinstance(value, str) and value
            and value.lower() not in _NOT_A_VALUE and _SECRET_KEY.search(key[-64:])):
        return MARKER
    return _redact_obj(value, env_pattern)


# -- streams --------------------------------------------------------------------------------------


class StreamRedactor:
    """Redacts one text stream (a child's stdout, a verify run) fed in arbitrary chunks.

    Stateless `redact` sees one piece at a time, so a private key printed line by line would
    lose only its BEGIN line. This keeps the state between pieces:
    - a key block open since a BEGIN line stays redacted until its END line, or the stream's end
      (its body lines are dropped, the block reads as one `[REDACTED]` line);
    - an unfinished line is held back until its newline, so a token split across two reads is
      seen whole; a line longer than `hold` is released in pieces, each cut where no secret
      pattern matches across it, keeping `overlap` characters back.
    `feed` returns the redacted text that is safe to release now; `close` returns the rest.
    Concatenated, the output equals `redact` of the whole stream wherever no key block is open.
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, hold: int = 65536, overlap: int = 8192):
        self._env_pattern = _env_redactor(env)
        self._hold = hold
        self._overlap = min(overlap, hold // 2)
        self._pending = ""
        self._in_key = False

    def feed(self, text: str) -> str:
        if not text:
            return ""
        self._pending += text
        end = self._pending.rfind("\n") + 1  # complete lines are released at once
        if end == 0 and len(self._pending) <= self._hold:
            return ""
        if len(self._pending) - end > self._hold:
            end = self._safe_cut(self._pending, len(self._pending) - self._overlap, end)
        ready, self._pending = self._pending[:end], self._pending[end:]
        return self._release(ready)

    def close(self) -> str:
        rest, self._pending = self._pending, ""
        out = self._release(rest) if rest else ""
        self._in_key = False
        return out

    def line(self, text: str) -> str | None:
        """One complete line in; its redacted text out, or None when it lies inside a key block."""
        out = self.feed(text + "\n")
        if not out:
            return None
        return out[:-1] if out.endswith("\n") else out

    def key_blocks_only(self, text: str) -> str | None:
        """One complete line in, with only what the stream's state knows taken out: a key block
        open since an earlier line (None: the line lies inside it) or opened here. For a caller
        that runs `redact` on each line it keeps, and would otherwise pay the patterns twice."""
        if not self._in_key and "-----BEGIN" not in text:
            return text
        out = self._release(text + "\n", patterns=False)
        if not out:
            return None
        return out[:-1] if out.endswith("\n") else out

    def _release(self, text: str, patterns: bool = True) -> str:
        if self._in_key:
            end = _PEM_END.search(text)
            if end is None:
                return ""  # still inside the key: nothing of it leaves
            self._in_key = False
            text = text[end.end():]
            text = text[1:] if text.startswith("\n") else text[2:] if text.startswith("\r\n") else text
            if not text:
                return ""
        opened = self._open_key(text)
        if opened is not None:
            self._in_key = True
            return (_redact_with(text[:opened], self._env_pattern) if patterns else text[:opened]) + MARKER + "\n"
        return _redact_with(text, self._env_pattern) if patterns else text

    @staticmethod
    def _open_key(text: str) -> int | None:
        """Where a key block begins that this text does not close, if one does."""
        last = None
        for match in _PEM_BEGIN.finditer(text):
            last = match
        if last is None or _PEM_END.search(text, last.end()):
            return None
        return last.start()

    def _safe_cut(self, text: str, cut: int, floor: int) -> int:
        """A cut at or before `cut` that no secret pattern matches across (never below `floor`)."""
        patterns = [*_TOKENS, *_PREFIXED, _ASSIGNMENT, *([self._env_pattern] if self._env_pattern else [])]
        window_start = max(floor, cut - 2 * self._overlap)
        moved = True
        while moved and cut > floor:
            moved = False
            for pattern in patterns:
                for match in pattern.finditer(text, window_start, min(len(text), cut + self._overlap)):
                    if match.start() < cut < match.end():
                        cut, moved = match.start(), True
        if cut <= floor:  # one secret-shaped run fills the whole window: release it all, redacted
            return len(text)
        return cut
