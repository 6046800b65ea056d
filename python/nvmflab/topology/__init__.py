"""Where target and host run, behind one `Host` interface (base.py). One module per kind:
`local` (this machine, pinned cores), `netns` (a namespace with a veth pair and an emulated link,
used by legs that need a real network device), `ssh` (real hosts from an inventory)."""
