"""What one OS process keeps for the keyed queue (``state``: its gate client, record buffer and lease
keeper), and how its gate calls outlast an outage or a lost reply (``outage``). Every process uses it:
web processes, commands, producers and workers."""
