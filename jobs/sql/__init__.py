"""The `replaylake sql` job: read-only SQL over a lake. `main` is the command; session opens the
lake, run and render answer a statement, shell is the interactive prompt."""
