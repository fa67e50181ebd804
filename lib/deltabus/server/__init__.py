"""`deltabus serve`: the google.pubsub.v1 gRPC API over a warehouse (issue 14).

``app`` builds and runs the server; ``state`` is what its services share; the Publisher and
Subscriber services are in ``publisher_service`` and ``subscriber_service``, StreamingPull in
``streaming``; ``convert`` maps proto-plus messages, ``status`` maps errors to status codes.
"""
