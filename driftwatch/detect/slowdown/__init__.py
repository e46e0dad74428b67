"""Step-time slowdowns: steps reduced to block levels, judged live and at a short run's end."""
