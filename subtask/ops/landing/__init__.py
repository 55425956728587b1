"""Landing delegated work: `merge`, `land` (the queue, its window, the hotfix lane, integrating and
verifying each landing), noticing jobs that landed by any route, cleanup and gc, and a record's
verify checked or run again. Each module's docstring states what it owns."""
