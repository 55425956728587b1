"""Everything kept in git: the repository, objects and refs by two backends, job records, notes,
worktrees, packing, signing, ownership."""
