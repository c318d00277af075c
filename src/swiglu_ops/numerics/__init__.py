"""Numeric rules written once: :mod:`.mx` (MX element formats, E8M0 scale rules, element codes, block
layouts), :mod:`.glu` (the GLU family's parameters and math), :mod:`.tolerances` (what "equal" means for a
fast backend). Nothing here knows about operators, backends or modules; everything above reads these."""
