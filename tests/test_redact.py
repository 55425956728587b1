"""subtask.model.redact: each secret shape, env values, idempotence, ordinary text left alone.

Fake secrets are assembled at run time (prefix + filler) so this file contains no string that a
secret scanner would flag on push.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from subtask.model.redact import MARKER, redact, redact_obj

NO_ENV: dict[str, str] = {}


def fake(prefix: str, body: str = "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789") -> str:
    return prefix + body


ANTHROPIC = fake("sk-" + "ant-api03-", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcdefghij")
OPENAI = fake("sk-", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefghijkl")
OPENAI_PROJECT = fake("sk-" + "proj-", "AbCdEfGhIj_KlMnOpQrSt-UvWxYz0123456789")
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SESSION_KEY_ID = "ASIA" + "Z2X3C4V5B6N7M8Q9"
GOOGLE = "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"  # AIza + 35
SLACK = "xox" + "b-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
JWT = ("eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
       + ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")


def assert_gone(secret: str, line: str, env=NO_ENV) -> str:
    out = redact(line, env)
    assert secret not in out, out
    assert MARKER in out
    return out


# -- one test per secret kind, each inside a plausible engine output line --------------------------


@pytest.mark.parametrize("key", [ANTHROPIC, OPENAI, OPENAI_PROJECT])
def test_llm_api_keys(key):
    out = assert_gone(key, f"[engine] using key {key} for this session")
    assert out == f"[engine] using key {MARKER} for this session"


@pytest.mark.parametrize("prefix", ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"])
def test_github_tokens(prefix):
    token = fake(prefix)
    out = assert_gone(token, f"remote: https://x-access-token:{token}@github.com/o/r.git")
    assert out.startswith("remote: https://x-access-token:")


def test_github_fine_grained_pat():
    token = fake("github_" + "pat_", "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGH")
    assert_gone(token, f"GH_TOKEN is {token}.")


@pytest.mark.parametrize("key_id", [AWS_KEY_ID, AWS_SESSION_KEY_ID])
def test_aws_access_key_ids(key_id):
    assert redact(f"aws configure: key {key_id} set", NO_ENV) == f"aws configure: key {MARKER} set"


@pytest.mark.parametrize("line", [
    "aws_secret_access_key = {v}",
    "AWS_SECRET_ACCESS_KEY={v}",
    '"aws_secret_access_key": "{v}"',
])
def test_aws_secret_access_key(line):
    value = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
    out = assert_gone(value, line.format(v=value))
    assert out.lower().startswith(("aws_secret_access_key", '"aws_secret_access_key"'))


def test_google_api_key():
    assert_gone(GOOGLE, f"maps: request with key={GOOGLE}&q=1")
    assert redact(f"key {GOOGLE} end", NO_ENV) == f"key {MARKER} end"


def test_slack_token():
    assert redact(f"posting with {SLACK}", NO_ENV) == f"posting with {MARKER}"


def test_slack_webhook():
    url = "https://hooks.slack.com/services/" + "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    out = assert_gone("XXXXXXXXXXXXXXXXXXXXXXXX", f"curl -X POST {url}")
    assert out == f"curl -X POST https://hooks.slack.com/services/{MARKER}"


def test_jwt():
    out = assert_gone(JWT, f"Set-Cookie: session={JWT}; HttpOnly")
    assert "HttpOnly" in out


def test_bearer_token():
    out = assert_gone("abcdef0123456789abcdef", "Authorization: Bearer abcdef0123456789abcdef")
    assert out == f"Authorization: Bearer {MARKER}"


@pytest.mark.parametrize("line,secret", [
    ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    ("authorization: basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    ("Proxy-Authorization: Basic YWxhZGRpbjpvcGVu", "YWxhZGRpbjpvcGVu"),
    ("curl -H 'Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b'",
     "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"),
    ('{"Authorization": "Digest username=x, response=6629fae49393a05397450978507c4ef1"}',
     "6629fae49393a05397450978507c4ef1"),
    ("Authorization: dXNlcjpodW50ZXIyMjIy", "dXNlcjpodW50ZXIyMjIy"),
])
def test_authorization_headers_of_any_scheme(line, secret):
    out = assert_gone(secret, line)
    assert out.lower().startswith(("authorization", "proxy-authorization", "curl", '{"authorization'))


def test_url_password():
    out = assert_gone("s3cr3tpw", "connecting to postgres://admin:s3cr3tpw@db:5432/app")
    assert out == f"connecting to postgres://admin:{MARKER}@db:5432/app"


@pytest.mark.parametrize("text", [
    "machine example.com login bob password nebula-otter-4417",
    "machine example.com\n  login bob\n  password nebula-otter-4417\n",
    "default login anonymous password nebula-otter-4417",
    "login bob password nebula-otter-4417 machine example.com",
    "machine a.example login x password nebula-otter-4417 account y",
])
def test_netrc_password_without_an_equals_sign(text):
    """`.netrc` writes `password X` (no `=` or `:`): a confined job that read one showed it."""
    out = assert_gone("nebula-otter-4417", text)
    assert f"password {MARKER}" in out and out.split()[:2] == text.split()[:2]  # the rest is kept
    assert redact(out, NO_ENV) == out


@pytest.mark.parametrize("kind", ["RSA ", "EC ", "OPENSSH ", "ENCRYPTED ", ""])
def test_pem_private_key_block(kind):
    block = (f"-----BEGIN {kind}PRIVATE KEY-----\n"
             "Proc-Type: 4,ENCRYPTED\n"
             "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n"
             "aFDrBz9vFqU4yBBkJ2NAYOQVRd0c3Kks8dXH0Zcmw9Bq1e+GZPIM9fDL3jN0wZ==\n"
             f"-----END {kind}PRIVATE KEY-----")
    out = redact(f"wrote key.pem:\n{block}\ndone", NO_ENV)
    assert out == f"wrote key.pem:\n{MARKER}\ndone"


def test_pem_private_key_with_json_escaped_newlines():
    text = json.dumps({"private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n"
                                      "-----END PRIVATE KEY-----\n"})
    out = redact(text, NO_ENV)
    assert "MIIEvQ" not in out
    json.loads(out)  # still a JSON document


def test_truncated_pem_private_key():
    out = redact("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn\nAAAA", NO_ENV)
    assert "MIIE" not in out and MARKER in out


def test_public_key_and_certificate_are_kept():
    text = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"
    assert redact(text, NO_ENV) == text


@pytest.mark.parametrize("line, expected", [
    ("password=hunter2", f"password={MARKER}"),
    ("PASSWORD = hunter2", f"PASSWORD = {MARKER}"),
    ("passwd: hunter2", f"passwd: {MARKER}"),
    ("token=abc123def", f"token={MARKER}"),
    ("Secret: 'shh it is'", f"Secret: '{MARKER}'"),
    ("api_key=abc123", f"api_key={MARKER}"),
    ("apikey: abc123", f"apikey: {MARKER}"),
    ("x-api-key: abc123", f"x-api-key: {MARKER}"),
    ("DB_PASSWORD=hunter2 ./run", f"DB_PASSWORD={MARKER} ./run"),
    ("export GITHUB_TOKEN=abc123def", f"export GITHUB_TOKEN={MARKER}"),
    ('{"password": "hunter2", "user": "bob"}', f'{{"password": "{MARKER}", "user": "bob"}}'),
    ("spring.datasource.password=hunter2", f"spring.datasource.password={MARKER}"),
    ("--password=hunter2 --user bob", f"--password={MARKER} --user bob"),
    ("GET /cb?token=abc123&state=1", f"GET /cb?token={MARKER}&state=1"),
    ('password="cut off by the tail', f'password="{MARKER} off by the tail'),
])
def test_assignments_keep_the_name(line, expected):
    assert redact(line, NO_ENV) == expected


def test_assignment_in_json_stays_json():
    doc = json.dumps({"config": {"token": "abc123", "enabled": True, "secret": None}})
    out = redact(doc, NO_ENV)
    assert json.loads(out) == {"config": {"token": MARKER, "enabled": True, "secret": None}}


# -- environment values ----------------------------------------------------------------------------


def test_secret_env_values_are_redacted_anywhere():
    env = {
        "MY_SERVICE_TOKEN": "plain-looking-value-42",
        "DEPLOY_CREDENTIALS": "correct horse battery staple",
        "X_AUTH": "authvalue99",
        "SHORT_KEY": "abc",  # too short to redact safely
        "HOME": "/home/someone",  # not a secret name
        "GIT_AUTHOR_NAME": "Jane Developer",  # AUTHOR is not AUTH
        "SSH_AUTH_SOCK": "/tmp/ssh-XXXXabcd/agent.42",  # a socket's path is not a secret
    }
    text = ("calling with plain-looking-value-42 and correct horse battery staple, authvalue99; "
            "abc in /home/someone by Jane Developer at /tmp/ssh-XXXXabcd/agent.42")
    out = redact(text, env)
    assert out == (f"calling with {MARKER} and {MARKER}, {MARKER}; "
                   "abc in /home/someone by Jane Developer at /tmp/ssh-XXXXabcd/agent.42")


def test_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("SUBTASK_TEST_SECRET", "zq9-unusual-value")
    assert redact("echo zq9-unusual-value") == f"echo {MARKER}"


def test_longer_env_value_wins_over_its_prefix():
    env = {"A_TOKEN": "prefixvalue", "B_TOKEN": "prefixvalue-and-more"}
    assert redact("x prefixvalue-and-more y", env) == f"x {MARKER} y"


# -- idempotence and ordinary text -----------------------------------------------------------------

ALL_KINDS = "\n".join([
    f"key {ANTHROPIC} {OPENAI} {OPENAI_PROJECT}",
    f"{fake('ghp_')} {AWS_KEY_ID} {GOOGLE} {SLACK} {JWT}",
    "https://hooks.slack.com/services/T0/B0/XYZ",
    "Authorization: Bearer abcdef0123456789abcdef",
    "postgres://admin:pw12345@db/x",
    "-----BEGIN PRIVATE KEY-----\nMIIEvQ\n-----END PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\nMIIEvQ",
    'password=hunter2 token: "abc" secret=\'x\' api_key=z DB_PASSWORD=q password="open',
    "uses plain-looking-value-42",
])
ENV = {"SOME_TOKEN": "plain-looking-value-42"}


def test_idempotent():
    once = redact(ALL_KINDS, ENV)
    assert redact(once, ENV) == once
    assert redact(redact(MARKER, ENV), ENV) == MARKER


def test_marker_text_as_env_value_does_not_break_idempotence():
    env = {"WEIRD_TOKEN": "REDACTED"}
    once = redact("token=abc", env)
    assert redact(once, env) == once


@pytest.mark.parametrize("text", [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
    "the tokenizer splits words; max_tokens=4096; input_tokens: 1200",
    "We planned a secret santa and kept the password policy doc short.",
    "Enter your login name and password below.",
    "machine learning needs no password manager here",
    "token_count = 3",
    "if password == expected:",
    "def login(password: str, token: str | None = None) -> bool:",
    '{"token": null, "secret": true}',
    "risk-assessment task-12345678901234567890123 ask-me-anything-about-it-please",
    "see docs/keys.md and the KEY column; monkey business",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "",
])
def test_ordinary_text_untouched(text):
    assert redact(text, NO_ENV) == text


def test_large_input_is_redacted():
    line = f"ok line with {ANTHROPIC} and password=hunter2 then prose about tokens\n"
    text = line * (1024 * 1024 // len(line) + 1)
    out = redact(text, NO_ENV)
    assert ANTHROPIC not in out and "hunter2" not in out
    assert out.count(MARKER) == 2 * text.count("\n")


# -- redact_obj ------------------------------------------------------------------------------------


def test_redact_obj_nested():
    original = {
        "type": "tool_result",
        "content": [{"text": f"found {ANTHROPIC}"}, "password=hunter2", 42, None],
        "meta": {"env": {"api_key": "plainvalue", "max_tokens": 100, "token": None},
                 "pair": ("ok", f"{AWS_KEY_ID}")},
        "sha": "3f786850e387550fdab836ed7e6dc881de23001b",
    }
    snapshot = json.dumps(original, default=list)
    out = redact_obj(original, NO_ENV)
    assert out == {
        "type": "tool_result",
        "content": [{"text": f"found {MARKER}"}, f"password={MARKER}", 42, None],
        "meta": {"env": {"api_key": MARKER, "max_tokens": 100, "token": None},
                 "pair": ("ok", MARKER)},
        "sha": "3f786850e387550fdab836ed7e6dc881de23001b",
    }
    assert json.dumps(original, default=list) == snapshot  # a new object; the input is untouched


def test_redact_obj_uses_env():
    assert redact_obj(["a plain-looking-value-42"], ENV) == [f"a {MARKER}"]


def test_redact_obj_scalars_pass_through():
    assert redact_obj(7, NO_ENV) == 7
    assert redact_obj(None, NO_ENV) is None
    assert redact_obj("nothing here", NO_ENV) == "nothing here"


# -- streams: StreamRedactor -----------------------------------------------------------------------

from subtask.model.redact import StreamRedactor  # noqa: E402

PEM_LINES = ["-----BEGIN RSA PRIVATE KEY-----",
             "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB",
             "aFDrBz9vFqU4yBBkJ2NAYOQVRd0c3Kks8dXH0Zcmw9Bq1e+GZPIM9fDL3jN0wZ==",
             "-----END RSA PRIVATE KEY-----"]
PEM_BODY = ("MIIEowIBAAKCAQEA0Z3VS5JJ", "aFDrBz9vFqU4yBBkJ2NA")


def stream(chunks, **kwargs) -> str:
    redactor = StreamRedactor(NO_ENV, **kwargs)
    return "".join(redactor.feed(chunk) for chunk in chunks) + redactor.close()


def test_a_key_printed_line_by_line_stays_redacted_until_its_end_line():
    redactor = StreamRedactor(NO_ENV)
    shown = [redactor.line(line) for line in ["before", *PEM_LINES, "after"]]
    assert shown == ["before", MARKER, None, None, None, "after"]


def test_a_key_that_never_ends_is_redacted_to_the_end_of_the_stream():
    out = stream([line + "\n" for line in ["before", *PEM_LINES[:3], "more output", "and more"]])
    assert out == f"before\n{MARKER}\n"
    assert not any(body in out for body in PEM_BODY)


@pytest.mark.parametrize("size", [1, 3, 7, 64, 4096])
def test_any_chunking_gives_the_same_redacted_stream(size):
    text = "\n".join(["start", *PEM_LINES, f"key {ANTHROPIC} and {fake('ghp_')}", "password=hunter2 x",
                      f"id {AWS_KEY_ID} {JWT}", "end"]) + "\n"
    whole = stream([text])
    assert stream([text[i:i + size] for i in range(0, len(text), size)]) == whole
    for secret in (*PEM_BODY, ANTHROPIC, fake("ghp_"), "hunter2", AWS_KEY_ID, JWT):
        assert secret not in whole
    assert whole.startswith("start\n") and whole.endswith("end\n")


def test_a_token_split_across_two_reads_is_caught():
    half = len(ANTHROPIC) // 2
    assert stream([f"using {ANTHROPIC[:half]}", f"{ANTHROPIC[half:]} now\n"]) == f"using {MARKER} now\n"


def test_a_very_long_line_is_released_in_pieces_without_cutting_a_secret():
    filler = "x " * 3000
    text = filler + ANTHROPIC + " " + filler + "password=hunter2 " + filler  # no newline at all
    redactor = StreamRedactor(NO_ENV, hold=1000, overlap=200)
    pieces = [redactor.feed(text[i:i + 97]) for i in range(0, len(text), 97)]
    out = "".join(pieces) + redactor.close()
    assert sum(1 for p in pieces if p) > 5, "released as it goes, not all at the end"
    assert ANTHROPIC not in out and "hunter2" not in out
    assert out == redact(text, NO_ENV)


def test_a_tail_cut_inside_a_key_loses_its_body_lines():
    tail = "\n".join(PEM_LINES[1:]) + "\nnext step ok"
    out = redact(tail, NO_ENV)
    assert out == f"{MARKER}\nnext step ok"
    assert redact(out, NO_ENV) == out


def test_a_text_without_a_secrets_shape_compiles_no_pattern_of_one():
    """Every `start` redacts its task: compiling all twenty patterns cost it ~3 ms, when a task
    such as `make test` holds the needle of none. A pattern is compiled the first time a text
    holds its needle, and then redacts as before."""
    script = (
        "import re, sys\n"
        "compiled = []\n"
        "real = re.compile\n"
        "re.compile = lambda p, f=0: compiled.append(p) or real(p, f)\n"
        "from subtask.model.redact import redact\n"
        "assert redact('make test', env={}) == 'make test'\n"
        "quiet = len(compiled)\n"
        "assert redact('key sk-' + 'a' * 24, env={}) == 'key [REDACTED]'\n"
        "print(quiet, len(compiled))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    quiet, after = map(int, proc.stdout.split())
    assert quiet == 0, f"{quiet} patterns compiled for a text with no needle"
    assert after == 1, "the one pattern whose needle it holds, and no other"
