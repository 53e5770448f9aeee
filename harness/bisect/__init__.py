"""`python -m harness.bisect`: the first commit where a finding's counters (or time) changed.

`commits` lists and checks the revisions, `probe` measures one commit in a fresh process
on that commit's code (in a temporary git worktree), `search` bisects over the decisions,
`cli` is the command.
"""
