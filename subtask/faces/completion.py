"""Shell completion for `git subtask …` and `git-subtask …`: bash, zsh and fish.

Each script asks the program itself (`git-subtask __complete WORD…`) for candidates, so new
commands and options complete without regenerating anything. Candidates: subcommands, the options
of the current command, an option's values after it, and job and group ids where a command takes
an ID. For bash, `_git_subtask` is the function git's own completion calls for `git subtask`.
"""

from __future__ import annotations

import click

ID_ARGUMENTS = {"job_id", "ids", "group_id"}

BASH = r'''# git-subtask completion for bash: source this file (e.g. from ~/.bashrc).
_git_subtask_words() {
    # $1: index of the first word after "subtask" / "git-subtask"
    local cur="${COMP_WORDS[COMP_CWORD]}"
    COMPREPLY=($(compgen -W "$(git-subtask __complete "${COMP_WORDS[@]:$1:COMP_CWORD-$1}" 2>/dev/null)" -- "$cur"))
}
# Called by git's completion for `git subtask ...`.
_git_subtask() {
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ "${COMP_WORDS[i]}" == subtask ]] && break
    done
    _git_subtask_words $((i + 1))
}
_git_subtask_standalone() { _git_subtask_words 1; }
complete -F _git_subtask_standalone git-subtask
'''

ZSH = r'''#compdef git-subtask
# git-subtask completion for zsh: put this file on $fpath as _git-subtask, or source it.
_git-subtask() {
    local -a candidates
    candidates=(${(f)"$(git-subtask __complete ${words[2,CURRENT-1]} 2>/dev/null)"})
    compadd -a candidates
}
# `git subtask` goes through zsh's _git, which calls _git-<command> when it exists.
compdef _git-subtask git-subtask
'''

FISH = r'''# git-subtask completion for fish: save as ~/.config/fish/completions/git-subtask.fish
function __git_subtask_complete
    set -l words (commandline -opc)
    if test "$words[1]" = git
        set words $words[3..-1]
    else
        set words $words[2..-1]
    end
    git-subtask __complete $words 2>/dev/null
end
complete -c git-subtask -f -a '(__git_subtask_complete)'
complete -c git -n '__fish_seen_subcommand_from subtask' -f -a '(__git_subtask_complete)'
'''

SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}


# The values of options whose type does not list them (a click.Choice completes its own choices).
VALUES = {
    "--isolation": ["none", "worktree", "readonly"],
    "--on": ["local", "ray"],
    "--state": ["queued", "running", "done", "failed", "stopped", "waiting", "skipped", "active", "ended"],
    "--older-than": ["12h", "7d", "30d"],
    "--check": ["no-test-deletion", "no-suppression", "paths=", "none"],
    "--retries": ["0", "1", "2", "3", "4", "5"],
}


def candidates(group: click.Group, words: list[str], job_ids, engines=lambda: []) -> list[str]:
    """What may come after `words` (the words typed so far, after the program name): commands,
    a command's options, the values an option takes (after it), and job and group ids where a
    command takes an ID. `job_ids` and `engines` are callables, asked only when needed."""
    ctx = click.Context(group)
    commands = [name for name, cmd in group.commands.items() if not cmd.hidden]
    if not words:
        return sorted(commands)
    command = group.commands.get(words[0])
    if command is None:
        return sorted(c for c in commands if c.startswith(words[0]))
    if isinstance(command, click.Group):
        return sorted(command.list_commands(ctx))
    if words[0] == "help":
        return sorted(commands)
    option = next((p for p in command.params if isinstance(p, click.Option) and words[-1] in p.opts), None)
    if option is not None and not option.is_flag:
        if isinstance(option.type, click.Choice):
            return list(option.type.choices)
        if option.name == "engine":
            return list(engines())
        if option.name == "after":  # start --after: the jobs and groups it may wait for
            return list(job_ids())
        return VALUES.get(option.opts[0], [])
    options = [opt for param in command.params if isinstance(param, click.Option) for opt in param.opts]
    out = sorted(options) + ["--help"]
    if any(isinstance(p, click.Argument) and p.name in ID_ARGUMENTS for p in command.params):
        out = list(job_ids()) + out
    return out
