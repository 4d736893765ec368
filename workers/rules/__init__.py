"""The pure rules more than one pool uses: assessment of minutes, fact text, timelines and relative dates."""
