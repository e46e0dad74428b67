"""The ranked likely causes of slowdowns and stalls: each cause's signals before and after,
scored and ranked."""
