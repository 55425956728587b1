"""Records as data, errors, settings, redaction, the words shown to people, fault points, the one
description of a start. Imports nothing of ours from above."""
