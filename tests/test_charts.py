"""plotly.js is served by the app itself, and figures are embedded safely."""

import json

from django.template import Context, Template
from django.templatetags.static import static
from django.test import Client

from config.static_finders import PLOTLY_DIR, PLOTLY_FILE
from charts import figure, figure_dict, threshold_line


def test_plotly_js_is_served_from_the_plotly_package():
    url = static("vendor/plotly.min.js")
    response = Client().get(url)
    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert body == (PLOTLY_DIR / PLOTLY_FILE).read_bytes()
    assert response["Content-Type"].startswith(("text/javascript", "application/javascript"))


def test_only_plotly_min_js_is_exposed_from_the_package():
    assert Client().get(static("vendor/widgetbundle.js")).status_code == 404


def test_include_loads_plotly_and_charts_script_from_this_server():
    html = Template('{% include "charts/plotly_js.html" %}').render(Context({}))
    assert 'src="/static/vendor/plotly.min.js"' in html
    assert 'src="/static/tracedash/charts.js"' in html
    assert "http" not in html


def test_figure_json_escapes_user_strings_in_json_script():
    fig = figure(title="latency")
    fig.add_scatter(x=[1, 2], y=[3, 4], name="</script><script>alert(1)</script>")
    threshold_line(fig, y=85, label="85 %")
    data = figure_dict(fig)
    assert data["data"][0]["y"] == [3, 4]
    html = Template('{{ fig|json_script:"f" }}').render(Context({"fig": data}))
    assert "</script><script>" not in html.split(">", 1)[1].rsplit("</script>", 1)[0]
    assert json.loads(html.split(">", 1)[1].rsplit("</script>", 1)[0])["data"][0]["name"].startswith("</script>")
