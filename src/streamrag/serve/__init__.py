"""Stage ⑩ of the data path: the HTTP query API (FastAPI on uvicorn)."""

from streamrag.serve.app import create_app

__all__ = ["create_app"]
