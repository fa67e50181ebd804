"""Push delivery: request formats, OIDC tokens, the HTTP client run on executors, and the job."""
