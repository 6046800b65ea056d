"""Where target and host run. `local` needs nothing; `netns` builds a namespace with a veth pair
and an emulated link (tc netem) so traffic crosses a real (virtual) network device."""
