"""The one delivery core: fan-out, lease selection, outcomes and the cursor, for every path
(pull, ``subscribe()``, the push job, and the paths to come). See ARCHITECTURE.md."""
