"""Operations over jobs: starting and ending attempts (`lifecycle`), landing and cleanup, best-of
groups, push/pull, the spend report from the records, hooks, re-running and re-checking a record's
verify, stalls. They import the layers below, never the worker or a face."""
