"""Models from an OCI registry: KitOps ModelKits and CNCF ModelPacks (docs/modelkits.md).

Pure parts (reference.py, artifact.py, credentials.py) apart from the I/O (store.py: the
content-addressed cache on disk; client.py: the distribution API over aiohttp). Facts and
sources: docs/modelkit-formats.md.
"""
