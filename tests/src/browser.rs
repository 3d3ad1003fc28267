//! A real browser for the console's tests: Debian's `chromium`, headless,
//! driven through `chromedriver` over the W3C WebDriver protocol (JSON over
//! HTTP on loopback, so a thin client on `reqwest` is all it takes).
//! `scripts/fetch-chromium.sh` installs both; without them a test skips, or
//! fails under `EDGELOOP_REQUIRE_SERVICES=1` ([`required`]).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use serde_json::{json, Value};

/// The key W3C WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// `chromedriver` on a free port, stopped when dropped.
pub struct Driver {
    child: Child,
    base: String,
    http: reqwest::Client,
}

/// Where the console tests put their screenshots: `$EDGELOOP_SCREENSHOTS`,
/// or `target/console-screenshots`.
pub fn screenshot_dir() -> PathBuf {
    std::env::var_os("EDGELOOP_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots")
        })
}

/// Where `chromium` and `chromedriver` are, or `None` when they are not
/// installed (through [`edgeloop_store::skip_or_fail!`], naming `what` would have
/// run in the browser).
pub fn required(what: &str) -> Option<(PathBuf, PathBuf)> {
    let found = installed();
    if found.is_none() {
        edgeloop_store::skip_or_fail!(
            "{what}: no chromium and chromedriver in /usr/bin or /usr/lib/chromium \
             (scripts/fetch-chromium.sh installs them; scripts/test.sh does)"
        );
    }
    found
}

/// Where `chromium` and `chromedriver` are, if installed.
fn installed() -> Option<(PathBuf, PathBuf)> {
    let find = |names: &[&str]| {
        names.iter().find_map(|n| {
            ["/usr/bin", "/usr/lib/chromium"]
                .iter()
                .map(|d| Path::new(d).join(n))
                .find(|p| p.exists())
        })
    };
    Some((
        find(&["chromium", "chromium-browser"])?,
        find(&["chromedriver"])?,
    ))
}

impl Driver {
    pub async fn start(chromedriver: &Path) -> anyhow::Result<Driver> {
        // Before the child exists: nothing between its start and the
        // guard that kills it may fail or panic.
        let http = reqwest::Client::new();
        let port = crate::free_port();
        // A process group of its own: the browsers it starts stay in it,
        // so dropping the driver ends them too, even when a test panics
        // before it closes its session.
        let child = Command::new(chromedriver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", chromedriver.display()))?;
        let base = format!("http://127.0.0.1:{port}");
        let driver = Driver { child, base, http };
        let started = Instant::now();
        loop {
            let status = driver.http.get(format!("{}/status", driver.base)).send();
            if let Ok(r) = status.await {
                if r.status().is_success() {
                    break;
                }
            }
            if started.elapsed() > Duration::from_secs(20) {
                bail!("chromedriver did not answer on {} within 20 s", driver.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(driver)
    }

    /// A headless browser session.
    pub async fn browser(&self, chromium: &Path) -> anyhow::Result<Browser> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000",
                         "--no-first-run", "--no-default-browser-check"]
            }
        }}});
        let v = call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}/session", self.base),
            Some(caps),
        )
        .await
        .context("starting a chromium session")?;
        let id = v["sessionId"]
            .as_str()
            .context("no sessionId in the new session")?
            .to_string();
        Ok(Browser {
            http: self.http.clone(),
            session: format!("{}/session/{id}", self.base),
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`Browser::contrast_failures`] in the page: WCAG's relative luminance
/// of sRGB colours and their contrast ratio.
const CONTRAST_CHECK: &str = r#"
const rgba = s => {
  const m = s.match(/rgba?\(([^)]+)\)/);
  if (!m) return null;
  const p = m[1].split(',').map(x => parseFloat(x));
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
};
const lum = c => {
  const [r, g, b] = c.slice(0, 3).map(v => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const background = el => {
  for (; el; el = el.parentElement) {
    const c = rgba(getComputedStyle(el).backgroundColor);
    if (c && c[3] > 0.99) return c;
  }
  return [255, 255, 255, 1];
};
const out = [];
for (const el of document.querySelectorAll('body *')) {
  if (el instanceof SVGElement) continue;
  const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own || el.getClientRects().length === 0) continue;
  const cs = getComputedStyle(el);
  if (cs.visibility === 'hidden') continue;
  const fg = rgba(cs.color), bg = background(el);
  const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
  const ratio = (hi + 0.05) / (lo + 0.05);
  const size = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight) >= 700;
  const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
  if (ratio < need) {
    out.push(el.tagName.toLowerCase() + ' "' + el.textContent.trim().slice(0, 40) + '": ' + ratio.toFixed(2) + ' < ' + need);
  }
}
return out;
"#;

/// One WebDriver call; the `value` of its answer, or the driver's error.
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let post = method == reqwest::Method::POST;
    let mut req = http.request(method, url);
    // WebDriver wants a JSON body on every POST, empty or not.
    if post {
        req = req.json(&body.unwrap_or_else(|| json!({})));
    }
    let res = req.send().await.with_context(|| url.to_string())?;
    let status = res.status();
    let v: Value = res.json().await.with_context(|| format!("{url}: answer"))?;
    if !status.is_success() {
        bail!(
            "{url}: {} {}",
            v["value"]["error"].as_str().unwrap_or("error"),
            v["value"]["message"].as_str().unwrap_or("")
        );
    }
    Ok(v["value"].clone())
}

/// A browser session. Closed with [`Browser::close`].
pub struct Browser {
    http: reqwest::Client,
    session: String,
}

/// An element of the current page.
pub struct Element {
    id: String,
}

impl Browser {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}{path}", self.session),
            Some(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        call(
            &self.http,
            reqwest::Method::GET,
            &format!("{}{path}", self.session),
            None,
        )
        .await
    }

    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({"url": url})).await.map(drop)
    }

    pub async fn url(&self) -> anyhow::Result<String> {
        Ok(self
            .get("/url")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    pub async fn title(&self) -> anyhow::Result<String> {
        Ok(self
            .get("/title")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Elements matching a CSS selector, now.
    pub async fn find_all(&self, css: &str) -> anyhow::Result<Vec<Element>> {
        let v = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|id| Element { id: id.to_string() })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The first element matching `css`, waiting up to `within` for it.
    pub async fn find(&self, css: &str, within: Duration) -> anyhow::Result<Element> {
        let started = Instant::now();
        loop {
            if let Some(e) = self.find_all(css).await?.into_iter().next() {
                return Ok(e);
            }
            if started.elapsed() > within {
                let mut says = String::new();
                if let Some(body) = self.find_all("body").await?.into_iter().next() {
                    says = self.element_text(&body).await.unwrap_or_default();
                }
                bail!(
                    "no `{css}` on {} within {within:?}; the page says: {says}",
                    self.url().await.unwrap_or_default(),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the text of `css` contains `want`.
    pub async fn wait_for_text(
        &self,
        css: &str,
        want: &str,
        within: Duration,
    ) -> anyhow::Result<String> {
        let started = Instant::now();
        loop {
            let text = self.text(css).await.unwrap_or_default();
            if text.contains(want) {
                return Ok(text);
            }
            if started.elapsed() > within {
                bail!("`{css}` did not say {want:?} within {within:?}; it says: {text}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let e = self.find(css, Duration::ZERO).await?;
        self.element_text(&e).await
    }

    pub async fn element_text(&self, e: &Element) -> anyhow::Result<String> {
        Ok(self
            .get(&format!("/element/{}/text", e.id))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    pub async fn attribute(&self, e: &Element, name: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .get(&format!("/element/{}/attribute/{name}", e.id))
            .await?
            .as_str()
            .map(str::to_string))
    }

    pub async fn click(&self, e: &Element) -> anyhow::Result<()> {
        self.post(&format!("/element/{}/click", e.id), json!({}))
            .await
            .map(drop)
    }

    pub async fn clear(&self, e: &Element) -> anyhow::Result<()> {
        self.post(&format!("/element/{}/clear", e.id), json!({}))
            .await
            .map(drop)
    }

    /// Types `text` into an element (WebDriver's key codes, e.g. `\u{E007}`
    /// for Enter, work too).
    pub async fn type_into(&self, e: &Element, text: &str) -> anyhow::Result<()> {
        self.post(&format!("/element/{}/value", e.id), json!({"text": text}))
            .await
            .map(drop)
    }

    /// Presses keys on whatever has the focus (Tab, Enter, letters).
    pub async fn keys(&self, keys: &str) -> anyhow::Result<()> {
        let mut actions = Vec::new();
        for k in keys.chars() {
            actions.push(json!({"type": "keyDown", "value": k.to_string()}));
            actions.push(json!({"type": "keyUp", "value": k.to_string()}));
        }
        self.post(
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}),
        )
        .await
        .map(drop)
    }

    /// Runs a script in the page and returns what it returns.
    pub async fn script(&self, script: &str) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// Text on the page whose contrast with its background is under WCAG
    /// 2.x AA (4.5:1, or 3:1 for large text: 24 px, or 18.66 px bold), as
    /// the browser computes the colours: each element that holds text of
    /// its own, its colour against the first opaque background at or above
    /// it. Each failure names the element, its text and the ratio. SVG text
    /// (the charts, drawn with fills of their own) is left out.
    pub async fn contrast_failures(&self) -> anyhow::Result<Vec<String>> {
        let found = self.script(CONTRAST_CHECK).await?;
        serde_json::from_value(found).context("the contrast check's answer")
    }

    /// Logs in at the console on `base` with an API token, from its login
    /// page (where a page that needs a session sends the browser), and
    /// waits for the page it comes back to.
    pub async fn log_in(&self, base: &str, token: &str) -> anyhow::Result<()> {
        self.goto(&format!("{base}/ui/fleet")).await?;
        let field = self.find("#token", Duration::from_secs(20)).await?;
        let url = self.url().await?;
        anyhow::ensure!(url.contains("/ui/login?next="), "not the login page: {url}");
        self.type_into(&field, token).await?;
        self.type_into(&field, "\u{E007}").await?; // Enter
        self.find("table.data, p.error", Duration::from_secs(20))
            .await
            .map(drop)
    }

    /// A screenshot of the page as `name` in [`screenshot_dir`], after
    /// checking that its text meets WCAG AA contrast
    /// ([`Browser::contrast_failures`]).
    pub async fn page_shot(&self, name: &str) -> anyhow::Result<()> {
        let failures = self.contrast_failures().await?;
        anyhow::ensure!(failures.is_empty(), "{name}: {failures:#?}");
        self.screenshot(&screenshot_dir().join(name)).await
    }

    /// A PNG of the viewport, saved at `path`.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        let b64 = self.get("/screenshot").await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or_default())
            .context("screenshot: not base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| path.display().to_string())
    }

    pub async fn close(self) -> anyhow::Result<()> {
        call(&self.http, reqwest::Method::DELETE, &self.session, None)
            .await
            .map(drop)
    }
}
