"""A confined job sees only what it needs (issue 40, docs/security.md "The job's view").

Tried as an adversary would: a real `ssh-agent` (one socket in the scratch tree, named by
`SSH_AUTH_SOCK`, one in the scratch HOME), a unix-socket service outside that writes a file when
asked, git's credential-cache daemon holding a password, and secret files in the scratch HOME.
Each test runs the same probe as a control under `--isolation none` first, where it reaches them
all (so the probe works), then confined (default network, and `network none`), where it reaches
none: the agents keep their key, the service writes nothing, no secret reaches the job's output,
branch, record or note, and the evidence lists what the view refused, as the view saw it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import git, wait_until

from subtask.proc import isolation, namespaces

LANDLOCK = isolation.support()
NAMESPACES = namespaces.support()
needs_view = pytest.mark.skipif(not (LANDLOCK.available and NAMESPACES.available),
                                reason=f"no confinement here: {LANDLOCK.reason or NAMESPACES.reason}")
SSH = shutil.which("ssh-agent") and shutil.which("ssh-add") and shutil.which("ssh-keygen")
needs_ssh = pytest.mark.skipif(not SSH,
                               reason="no ssh-agent here (Debian: apt-get install openssh-client; .ci/run does)")

# Secret texts no redaction pattern knows: only the view can keep them out.
NETRC_SECRET = "amber-falcon-9137"
AWS_SECRET = "quiet-meadow-2264"
NOTES_SECRET = "violet-harbor-5521"
CACHE_SECRET = "copper-lantern-8806"
ENV_SECRET = "silver-canyon-4410"
SECRETS = (NETRC_SECRET, AWS_SECRET, NOTES_SECRET, CACHE_SECRET, ENV_SECRET)


@dataclass
class Host:
    """What the user's machine holds outside the job: agents, a service, a credential cache, files."""

    home: Path
    key: Path
    agent_tree: Path
    agent_home: Path
    service: Path
    service_wrote: Path
    cache_socket: Path
    abstract: str  # an abstract unix socket's name (no file: the network namespace or Landlock scopes it)
    abstract_wrote: Path

    def agent_keys(self, sock: Path) -> str:
        proc = subprocess.run(["ssh-add", "-l"], env=dict(os.environ, SSH_AUTH_SOCK=str(sock)),
                              capture_output=True, text=True, check=False)
        return proc.stdout if proc.returncode == 0 else ""

    def env(self) -> dict[str, str]:
        return {"SSH_AUTH_SOCK": str(self.agent_tree), "SERVICE_SOCK": str(self.service),
                "DEPLOY_TOKEN": ENV_SECRET}


def _agent(sock: Path, key: Path) -> subprocess.Popen:
    """A real ssh-agent holding `key`, once it answers: its socket file is there (bind) a moment
    before it listens, and `ssh-add` then fails with 2 ("could not open a connection")."""
    env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            return subprocess.run(["ssh-add", "-l"], env=env, capture_output=True).returncode != 2

        assert wait_until(answers, timeout=30, interval=0.05), "ssh-agent never answered on its socket"
        subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc


def _service(sock: Path | str, wrote: Path) -> socket.socket:
    """A unix-socket service that writes a file when asked (like a docker daemon would run one)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock) if isinstance(sock, Path) else sock)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(1024)
                if data:
                    wrote.write_bytes(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.fixture
def host(tmp_path, isolated_git):
    if not SSH:
        pytest.skip("no ssh-agent here (Debian: apt-get install openssh-client; .ci/run does)")
    home = isolated_git
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    key = scratch / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user@host", "-f", str(key)], check=True)
    (home / ".ssh").mkdir(mode=0o700)
    shutil.copy(key, home / ".ssh" / "id_ed25519")
    (home / ".netrc").write_text(f"machine example.com login bob password {NETRC_SECRET}\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {AWS_SECRET}\n")
    (home / ".private").mkdir()
    (home / ".private" / "notes.txt").write_text(f"{NOTES_SECRET}\n")
    h = Host(home, key, scratch / "agent.sock", home / ".ssh" / "agent.sock", scratch / "service.sock",
             scratch / "service-wrote", home / ".cache" / "git" / "credential" / "socket",
             f"subtask-test-{os.getpid()}-{secrets.token_hex(4)}", scratch / "abstract-wrote")  # machine-wide name
    agents = [_agent(h.agent_tree, key), _agent(h.agent_home, key)]
    server = _service(h.service, h.service_wrote)
    abstract = _service("\0" + h.abstract, h.abstract_wrote)
    subprocess.run(["git", "-c", "credential.helper=cache", "credential", "approve"], check=True,
                   input=f"protocol=https\nhost=example.com\nusername=bob\npassword={CACHE_SECRET}\n\n", text=True)
    assert h.cache_socket.exists(), "git's credential-cache daemon made no socket where git looks"
    try:
        yield h
    finally:
        subprocess.run(["git", "credential-cache", "exit"], check=False, capture_output=True)
        server.close()
        abstract.close()
        for agent in agents:
            agent.terminate()
            agent.wait(timeout=30)


def probe(h: Host) -> str:
    """What a hostile job tries: every door, then commits and prints what it got."""
    connect = ('python3 -c "import socket, sys; a = sys.argv[1]; s = socket.socket(socket.AF_UNIX); '
               's.connect(chr(0) + a[1:] if a[0] == \'@\' else a); s.sendall(b\'write please\')" ')
    return "\n".join([
        f"for s in '{h.agent_tree}' '{h.agent_home}'; do SSH_AUTH_SOCK=$s ssh-add -D; echo agent-delete=$?; done",
        "printf 'protocol=https\\nhost=example.com\\n\\n' | git credential-cache get > loot-cache.txt; echo cache=$?",
        f"{connect} '{h.service}'; echo service=$?",
        f"{connect} '@{h.abstract}'; echo abstract=$?",
        f"cat '{h.home}/.netrc' '{h.home}/.aws/credentials' '{h.home}/.ssh/id_ed25519' "
        f"'{h.home}/.private/notes.txt' > loot-files.txt; echo files=$?",
        'echo "$DEPLOY_TOKEN" > loot-env.txt; echo "sock=${SSH_AUTH_SOCK:-unset} service=${SERVICE_SOCK:-unset}"',
        "cat loot-files.txt loot-cache.txt loot-env.txt",
        "git add loot-*.txt && git commit -qm loot; echo commit=$?",
    ])


def outputs(repo: Path, job: str) -> str:
    events = (repo / ".git" / "subtask" / "run" / f"{job}.events.jsonl").read_text().splitlines()
    return "\n".join(e.get("text", "") for e in map(json.loads, events) if e.get("type") == "output")


def said(repo: Path, job: str) -> dict[str, str]:
    lines = outputs(repo, job).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)


def everything_kept(cli, repo: Path, job: str) -> str:
    """Every place a job's text goes: its branch, record, note, output and evidence."""
    return "\n".join([
        git(repo, "log", "-p", f"subtask/{job}"),
        git(repo, "log", "-p", f"refs/subtask/{job}/record"),
        git(repo, "log", "--notes=subtask", "-1", f"subtask/{job}"),
        outputs(repo, job), cli.ok("show", job), cli.ok("result", job, "--full"),
        cli.ok("result", job, "--evidence"),
    ])


FAKE_AGENT = r'''#!/bin/sh
# A stand-in for `ssh-agent -D -a SOCK`: like the real one between bind() and listen(), its
# socket file is there before anything answers on it; it hands over to the real agent only
# after an `ssh-add` has tried it (the log FAKE_SSH_TRIES), so no timing of ours decides it.
python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$3"
while [ ! -s "$FAKE_SSH_TRIES" ]; do sleep 0.01; done
rm -f "$3"
exec REAL_AGENT "$@"
'''
FAKE_ADD = r'''#!/bin/sh
REAL_ADD "$@"; code=$?
echo "$code" >> "$FAKE_SSH_TRIES"
exit $code
'''


@needs_ssh
def test_the_hosts_agent_is_given_its_key_only_once_it_answers(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh-agent", FAKE_AGENT), ("ssh-add", FAKE_ADD)):
        real = shutil.which(name)
        (bin_dir / name).write_text(text.replace("REAL_AGENT", real).replace("REAL_ADD", real))
        (bin_dir / name).chmod(0o755)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    tries = tmp_path / "tries"
    monkeypatch.setenv("FAKE_SSH_TRIES", str(tries))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sock = tmp_path / "agent.sock"
    agent = _agent(sock, key)
    try:
        assert "2" in tries.read_text().split(), "the agent answered at once: nothing was tried early"
        listed = subprocess.run(["ssh-add", "-l"], env=dict(os.environ, SSH_AUTH_SOCK=str(sock)),
                                capture_output=True, text=True)
        assert listed.returncode == 0 and "ED25519" in listed.stdout, listed
    finally:
        agent.terminate()
        agent.wait(timeout=30)


@needs_view
@needs_ssh
def test_the_probe_reaches_every_door_unconfined(cli, repo, host):
    """The control: under `isolation none` the same probe lists and deletes the agents' keys,
    reads the cached password and every secret file, and makes the service write its file."""
    job = cli.start(probe(host), "--isolation", "none", env=host.env())
    cli.ok("wait", job)
    assert said(repo, job)["commit"] == "0"
    assert host.agent_keys(host.agent_tree) == "" and host.agent_keys(host.agent_home) == ""
    assert host.service_wrote.read_bytes() == b"write please"
    assert host.abstract_wrote.read_bytes() == b"write please"
    branch = git(repo, "log", "-p", f"subtask/{job}")
    for secret in SECRETS:
        assert secret in branch, secret


@needs_view
@needs_ssh
@pytest.mark.parametrize("network", ["allow", "none"])
def test_a_confined_job_reaches_no_host_socket_and_no_secret(cli, repo, host, network):
    git(repo, "config", "subtask.isolation.network", network)
    job = cli.start(probe(host), "--isolation", "worktree", env=host.env())
    cli.ok("wait", job)
    values = said(repo, job)
    assert values["commit"] == "0", outputs(repo, job)  # it ran, and could commit in its worktree
    assert "ED25519" in host.agent_keys(host.agent_tree) and "ED25519" in host.agent_keys(host.agent_home)
    assert not host.service_wrote.exists() and not host.abstract_wrote.exists()
    kept = everything_kept(cli, repo, job)
    for secret in SECRETS:
        assert secret not in kept, secret
    assert "sock=unset service=unset" in outputs(repo, job)
    iso = cli.json("show", job)["evidence"]["isolation"]
    refused = "\n".join(iso["refused"])
    for path in (host.agent_tree, host.agent_home, host.service, host.cache_socket):
        assert f"connect {path}" in refused, "\n".join(iso["refused"])
    for name in (".netrc", ".aws/credentials", ".ssh/id_ed25519"):
        assert f"open {host.home / name}" in refused, (name, iso["refused"])
    assert {"SSH_AUTH_SOCK", "SERVICE_SOCK", "DEPLOY_TOKEN"} <= set(iso["env_withheld"]), iso
    assert iso["view"] == "allowlist" and iso["network"] == network


@needs_view
@needs_ssh
def test_a_socket_and_a_variable_granted_by_name_are_reached_and_shown(cli, repo, host):
    """`subtask.isolation.socket PATH` lets one socket in, recorded in the spec and the evidence;
    `subtask.isolation.env NAME` passes one variable; every other door stays shut."""
    git(repo, "config", "--add", "subtask.isolation.socket", str(host.service))
    git(repo, "config", "--add", "subtask.isolation.env", "SERVICE_SOCK")
    job = cli.start(probe(host), "--isolation", "worktree", env=host.env())
    cli.ok("wait", job)
    assert host.service_wrote.read_bytes() == b"write please"
    assert f"service={host.service}" in outputs(repo, job) and "sock=unset" in outputs(repo, job)
    assert "ED25519" in host.agent_keys(host.agent_tree)
    shown = cli.json("show", job)
    assert shown["spec"]["sockets"] == [str(host.service)]
    iso = shown["evidence"]["isolation"]
    assert iso["sockets"] == [str(host.service)]
    assert "SERVICE_SOCK" not in iso["env_withheld"] and "SSH_AUTH_SOCK" in iso["env_withheld"]
    assert f"connect {host.service}" not in "\n".join(iso["refused"])


@needs_view
def test_output_that_reads_like_a_refusal_is_a_claim_never_an_observation(cli, repo):
    """A job can print "Permission denied" about anything; that is what it claims, not what the
    sandbox saw, and it is listed apart."""
    job = cli.start("echo \"cat: /etc/shadow: Permission denied\"; echo done", "--isolation", "worktree")
    cli.ok("wait", job)
    iso = cli.json("show", job)["evidence"]["isolation"]
    assert iso["refused"] == [] and iso["claimed"] == ["cat: /etc/shadow: Permission denied"], iso


PROJECT = {
    ".gitignore": ".venv/\n",
    "calc/__init__.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": ("import unittest\n\nfrom calc import add\n\n\n"
                           "class AddTest(unittest.TestCase):\n    def test_add(self):\n"
                           "        self.assertEqual(add(2, 3), 5)\n"),
}


@needs_view
def test_a_confined_job_runs_a_projects_tests_from_a_venv_in_its_worktree_and_uses_tmp_and_git(cli, repo):
    """What the view must keep working: Python (its interpreter lives in the user's HOME here,
    under pyenv), a venv made inside the worktree, `$TMPDIR` and `/tmp`, and git; while other
    jobs' worktrees, the main checkout and the state folder (but the job's own attempt files, its
    task) are not there at all."""
    for name, text in PROJECT.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "project")
    other = cli.start("echo other > other.txt")
    cli.ok("wait", other)
    activated = repo.parent / "activated-venv"  # a venv on the starter's PATH, outside the worktree
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(activated)], check=True)
    task = "\n".join([
        "python3 -m venv --without-pip .venv && .venv/bin/python -m unittest discover -s tests -q; echo unittest=$?",
        "python -c 'import sys; print(\"prefix=\" + sys.prefix)'",
        'echo t > "$TMPDIR/t" && echo u > /tmp/u && cat "$TMPDIR/t" /tmp/u; echo tmp=$?',
        "echo change > change.txt && git add change.txt && git commit -qm change; echo commit=$?",
        f"ls '{repo}/.subtask/worktrees/{other}' 2>/dev/null | wc -l | sed 's/^/other-worktree=/'",
        f"test -e '{repo}/README.md'; echo main-checkout=$?",
        f"find '{repo}/.git/subtask' -type f ! -name \"$SUBTASK_JOB_ID.1.*\" | wc -l | sed 's/^/state-folder=/'",
    ])
    job = cli.start(task, "--isolation", "worktree", env={"PATH": f"{activated}/bin:{os.environ['PATH']}"})
    cli.ok("wait", job)
    values = said(repo, job)
    assert values["unittest"] == "0", outputs(repo, job)
    assert values["prefix"] == str(activated), outputs(repo, job)
    assert values["tmp"] == "0" and values["commit"] == "0", outputs(repo, job)
    assert values["other-worktree"] == "0" and values["main-checkout"] != "0" and values["state-folder"] == "0"
    assert git(repo, "log", "-1", "--format=%s", f"subtask/{job}") == "change"
    private = repo / ".subtask" / "worktrees" / ".tmp"  # its private folders go (moved aside, then removed)
    assert wait_until(lambda: not [p for p in private.iterdir() if job in p.name], timeout=30), list(private.iterdir())


@needs_view
def test_a_confined_job_commits_as_the_user_whose_identity_is_only_in_the_global_config(repo, isolated_git):
    """The user's global git config is not in the view (it may name credential helpers, URLs with
    tokens): the job's git gets the identity it names through GIT_AUTHOR_*/GIT_COMMITTER_*."""
    git(repo, "config", "--global", "user.name", "Global Person")
    git(repo, "config", "--global", "user.email", "global@example.com")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_AUTHOR_", "GIT_COMMITTER_"))}

    def run(*args: str) -> str:
        return subprocess.run(["git", "subtask", *args], cwd=repo, env=env, capture_output=True, text=True,
                              check=True, timeout=120).stdout

    job = run("start", "--isolation", "worktree", "echo x > x.txt && git add x.txt && git commit -qm mine").split()[0]
    run("wait", job)
    assert git(repo, "log", "-1", "--format=%an <%ae> / %cn <%ce>", f"subtask/{job}") == \
        "Global Person <global@example.com> / Global Person <global@example.com>"


AS_ANOTHER_USER = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from subtask.proc import isolation, procs
repo, area, outside = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
worktree, admin = repo / ".subtask" / "worktrees" / "st-x", repo / ".git" / "worktrees" / "st-x"
policy = isolation.build_policy("worktree", worktree=worktree, admin=admin, common_dir=repo / ".git",
                                has_branch=True, tmpdir=str(area), extra=[], engine_extra=[])
isolation.plan_namespaces(policy, network="allow", asked=True)
with isolation.confined(isolation.Sandbox(policy)):
    result = procs.run(["sh", "-c", "read -r inside outside count < /proc/self/uid_map; echo uid=$inside:$outside; "
                        "grep -q subtask-init /proc/1/cmdline; echo pid1=$?; touch /etc/x; echo etc=$?; "
                        f"cat {outside}; echo outside=$?; echo w > w.txt; echo worktree=$?; "
                        "git add w.txt && git -c user.name=n -c user.email=e commit -qm w; echo commit=$?"],
                       cwd=worktree)
print(result.stdout_tail + result.stderr_tail)
"""


@needs_view
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK),
                    reason="switching to another user needs root, setpriv and a system python3")
def test_the_view_is_built_for_a_user_who_is_not_root():
    """Where the code differs for a user (a user namespace lends the capabilities; a fresh /proc
    needs one shown first): the same view, built by `nobody` with the system's python3."""
    root = Path(tempfile.mkdtemp(prefix="subtask-nobody-"))  # pytest's own folders are 0700
    try:
        _as_nobody(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as_nobody(root: Path) -> None:
    root.chmod(0o755)
    repo = root / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a").write_text("a\n")
    git(repo, "add", "a")
    git(repo, "commit", "-qm", "a")
    git(repo, "worktree", "add", "-q", "-b", "subtask/st-x", str(repo / ".subtask" / "worktrees" / "st-x"))
    (root / "area").mkdir()
    outside = root / "outside.txt"
    outside.write_text("not for the job\n")
    subprocess.run(["chown", "-R", "65534:65534", str(root)], check=True)
    package = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", f"HOME={root}",
                           "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", AS_ANOTHER_USER, package, str(repo),
                           str(root / "area"), str(outside)], capture_output=True, text=True, timeout=120)
    said = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and " " not in line)
    assert said.get("uid") == "65534:65534", proc.stdout + proc.stderr  # its own user namespace, mapped to itself
    assert said["pid1"] == "0" and said["etc"] != "0" and said["outside"] != "0", said  # its own /proc
    assert said["worktree"] == "0" and said["commit"] == "0", said
