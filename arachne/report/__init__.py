"""Rich tables and matplotlib figures shared by the commands."""
