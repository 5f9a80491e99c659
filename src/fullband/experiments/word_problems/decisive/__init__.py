"""``fullband eval-decisive``: the controls that decide transformer length generalisation (NoPE, the normalised
looped form, depth that grows with n without the shift), each arm chosen by a rule fixed before the runs and confirmed
on fresh seeds, with a second training range (DESIGN.md §7; docs/results/reasoning-decisive)."""
