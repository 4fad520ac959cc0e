"""WhiteNoise, without a thread hop for every request.

WhiteNoise's middleware is synchronous, so under ASGI Django wraps every request — ingestion
included — in sync/async adapters to pass through it (measured: about an eighth of the server's
Python time under ingest load). This subclass is async-capable: the lookup is a dictionary read,
a static file is served as WhiteNoise serves it, and every other request goes straight on.
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None):
        super().__init__(get_response)
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)
