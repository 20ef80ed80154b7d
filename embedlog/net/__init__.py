"""The wire protocol, the asyncio bookie server and the client transport."""
