"""git-subtask: hand coding work to background agents, with every job kept in git.

Keep this module import-free: every CLI call and every worker imports it first.
"""

__version__ = "0.1.0"
