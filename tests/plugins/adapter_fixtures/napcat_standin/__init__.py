"""A stand-in for the NapCat adapter plugin (a package, as the official one is)."""
