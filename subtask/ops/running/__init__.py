"""Running jobs: starting and ending attempts, admission (slots and money), stalls, attention
(notify), the event feed, the spend the records hold, `--engine auto` routing and disk use. Each
module's docstring states what it owns."""
