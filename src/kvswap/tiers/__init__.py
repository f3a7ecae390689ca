"""Moving state between RAM and disk, off the engine thread: slot and page files, the demoter."""
