"""A request checked and tokenised, wherever it then runs: the same 400s for the same fields
in both backends before anything is held, and the worst case the quotas reserve."""
