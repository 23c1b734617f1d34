"""The Slack front-end: `/k3repro` commands, a live thread per run, and one outbox for every Slack write."""
