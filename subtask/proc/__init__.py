"""Starting and ending processes: spawning a worker, running a child (pipes, timeouts, groups), and
confining a job's processes (Landlock, namespaces)."""
