"""Moving state off the engine thread: between RAM and disk (slot and page files, the
demoter), and in a cluster to and from the shared Redis tier (`tiers.shared`)."""
