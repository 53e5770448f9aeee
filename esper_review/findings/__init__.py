"""The review's findings: one module per ticket's claim, each a `register(Finding(...))`;
`peers` holds the other libraries' GAE that B4-CR-03 times beside ours, `copies` the
host-to-device copy count several findings report."""
