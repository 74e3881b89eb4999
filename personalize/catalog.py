"""The methods' names, importable without the model code (the CLI's light commands, such as `campaign status`,
check them without loading torch)."""

# Columns of the Compare tab, in order; every name the methods registry knows.
ALL_METHODS = ("base", "cluster", "card", "exact", "rag", "pag", "cope", "oppu", "p2p")
# What Compare and Rate start with: the methods that need no per-user training.
DEFAULT_METHODS = ("base", "cluster", "card", "exact", "rag", "cope")
