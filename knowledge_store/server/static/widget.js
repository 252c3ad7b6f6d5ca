/* Groundwork docs-site chat widget (docs/WIDGET.md).

   One tag on any page:
     <script src="http://127.0.0.1:8080/widget.js" async></script>

   puts a collapsed "Ask" button on the page.  It opens a panel that asks POST /api/ask and
   shows the answer with its cited sources (links open at the page / anchor), and offers
   "Ask about this selection" for text the reader selected, which asks POST /api/ask-local
   scoped to this page's document.

   Why it is built the way it is:
   - Self-contained: no dependencies, no network requests but the API's.
   - Shadow DOM: the host page's CSS cannot reach the widget's elements, and the widget's
     CSS cannot reach the page's; the host element resets every property it could inherit.
   - Server text (answers, titles, sections, error messages) only ever goes through
     textContent / attributes, never innerHTML; only http(s) links are made.
   - The API must allow this page's origin (GROUNDWORK_CORS_ORIGINS); when it does not, the
     browser refuses the call without showing why, so the widget checks whether the server
     is up at all (a no-cors request for this script) to tell "refused" from "unreachable".

   Options (data- attributes on the script tag):
     data-api                the API base URL (default: where this script was loaded from)
     data-title              panel title (default "Ask the docs")
     data-label              button text (default "Ask")
     data-position           bottom-right (default) | bottom-left
     data-source-file        the document "Ask about this selection" is scoped to; "{path}" is
                             replaced by the page's URL path without its outer slashes.
                             Default: the page's <link rel="canonical"> or its address (without
                             #fragment), which is the key a crawled web source is stored under.
     data-selection          "off" hides "Ask about this selection"
     data-min-selection-words  fewer selected words ask the reader to select more (default 10)
*/
(function () {
  "use strict";

  if (window.GroundworkWidget) {
    return; // the tag appears twice (e.g. a theme and a page both add it): one widget is enough
  }

  var VERSION = "1";
  var TIMEOUT_MS = 30000;         // an answer slower than this is reported as "taking too long"
  var PROBE_TIMEOUT_MS = 5000;    // the "is the server up at all?" check after a refused call
  var MAX_CONTEXT_CHARS = 20000;  // the API's limit for the selected text (AskLocalBody.context)
  var SELECTION_QUOTE_CHARS = 160;
  var DEFAULT_QUESTION = "What does this mean?"; // asked when the reader sends a selection without a question
  var POSITIONS = ["bottom-right", "bottom-left"];

  var script = document.currentScript ||
    document.querySelector('script[src$="/widget.js"], script[src*="/widget.js?"]');

  function option(name, fallback) {
    var value = script && script.getAttribute("data-" + name);
    return value === null || value === undefined || value === "" ? fallback : value;
  }

  function log(level, message) {
    // eslint-disable-next-line no-console
    console[level]("[Groundwork widget] " + message);
  }

  function resolveApiBase() {
    var configured = option("api", "");
    var base;
    try {
      if (configured) {
        base = new URL(configured, window.location.href);
      } else if (script && script.src) {
        base = new URL(".", script.src); // the folder this script came from: /widget.js -> the API root
      } else {
        return null;
      }
    } catch (error) {
      return null;
    }
    if (base.protocol !== "http:" && base.protocol !== "https:") {
      return null;
    }
    return base.href.replace(/[?#].*$/, "").replace(/\/+$/, "");
  }

  var apiBase = resolveApiBase();
  if (!apiBase) {
    log("error", "cannot tell where the Groundwork API is: load this script with <script src=\"http://HOST:PORT/widget.js\"> " +
        "or give data-api=\"http://HOST:PORT\" (got data-api=" + JSON.stringify(option("api", "")) + ")");
    return;
  }

  var position = option("position", "bottom-right");
  if (POSITIONS.indexOf(position) < 0) {
    log("warn", "data-position=" + JSON.stringify(position) + " is not one of " + POSITIONS.join(", ") +
        "; using bottom-right");
    position = "bottom-right";
  }
  var minSelectionWords = parseInt(option("min-selection-words", "10"), 10);
  if (!(minSelectionWords >= 1)) {
    log("warn", "data-min-selection-words must be a whole number >= 1; using 10");
    minSelectionWords = 10;
  }
  var selectionEnabled = option("selection", "on") !== "off";
  var titleText = option("title", "Ask the docs");
  var labelText = option("label", "Ask");

  // ------------------------------------------------------------------ styles (scoped to the shadow root)

  var CSS = [
    ":host { all: initial; }",
    ".gw { --accent: #1d4ed8; --accent-dark: #1e3a8a; --text: #1f2933; --muted: #4b5563; --panel: #ffffff;",
    "  --border: #c9d1da; --soft: #f1f5f9; --focus: #b45309; --error: #b91c1c; --error-bg: #fef2f2;",
    "  font: 15px/1.5 system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif;",
    "  color: var(--text); text-align: left; direction: ltr; letter-spacing: normal; }",
    ".gw *, .gw *::before, .gw *::after { box-sizing: border-box; }",
    ".gw [hidden] { display: none !important; }",
    ".gw button, .gw textarea { font: inherit; color: inherit; }",
    ".gw :focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }",
    ".launcher { position: fixed; bottom: 20px; z-index: 2147483000; display: inline-flex; align-items: center;",
    "  gap: 8px; min-height: 48px; padding: 10px 20px; border: 0; border-radius: 999px; cursor: pointer;",
    "  background: var(--accent); color: #fff; font-weight: 600; box-shadow: 0 4px 14px rgba(15,23,42,.28); }",
    ".launcher:hover { background: var(--accent-dark); }",
    ".launcher svg { width: 20px; height: 20px; fill: currentColor; }",
    ".gw[data-position=bottom-right] .launcher { right: 20px; }",
    ".gw[data-position=bottom-left] .launcher { left: 20px; }",
    ".selection-button { position: fixed; z-index: 2147483001; min-height: 40px; padding: 8px 14px; cursor: pointer;",
    "  border: 1px solid var(--accent-dark); border-radius: 8px; background: var(--accent); color: #fff;",
    "  font-weight: 600; box-shadow: 0 4px 12px rgba(15,23,42,.25); }",
    ".selection-button:hover { background: var(--accent-dark); }",
    ".panel { position: fixed; bottom: 84px; z-index: 2147483002; width: 390px; max-width: calc(100vw - 40px);",
    "  height: min(620px, calc(100vh - 110px)); display: flex; flex-direction: column; overflow: hidden;",
    "  background: var(--panel); border: 1px solid var(--border); border-radius: 12px;",
    "  box-shadow: 0 12px 40px rgba(15,23,42,.30); }",
    ".gw[data-position=bottom-right] .panel { right: 20px; }",
    ".gw[data-position=bottom-left] .panel { left: 20px; }",
    ".panel-header { display: flex; align-items: center; justify-content: space-between; gap: 8px;",
    "  padding: 10px 12px 10px 16px; background: #0f172a; color: #f8fafc; }",
    ".panel-header h2 { margin: 0; font-size: 16px; font-weight: 650; }",
    ".close { min-width: 40px; min-height: 40px; border: 0; border-radius: 8px; background: transparent;",
    "  color: #f8fafc; font-size: 22px; line-height: 1; cursor: pointer; }",
    ".close:hover { background: rgba(255,255,255,.12); }",
    ".close:focus-visible { outline-color: #fbbf24; }",
    ".log { flex: 1 1 auto; overflow-y: auto; padding: 12px 16px; display: flex; flex-direction: column; gap: 12px; }",
    ".intro { margin: 0; color: var(--muted); }",
    ".question { align-self: flex-end; max-width: 88%; padding: 8px 12px; border-radius: 12px 12px 2px 12px;",
    "  background: var(--accent); color: #fff; white-space: pre-wrap; overflow-wrap: anywhere; }",
    ".question .about { display: block; margin-top: 4px; font-size: 13px; color: #dbeafe; }",
    ".answer { max-width: 100%; padding: 10px 12px; border-radius: 12px 12px 12px 2px; background: var(--soft);",
    "  overflow-wrap: anywhere; }",
    ".answer p { margin: 0; white-space: pre-wrap; }",
    ".answer a { color: var(--accent); }",
    ".answer a:hover { color: var(--accent-dark); }",
    ".cite { font-size: 12px; vertical-align: super; line-height: 0; text-decoration: none; padding: 0 1px; }",
    ".sources-title { margin: 10px 0 4px; font-size: 13px; font-weight: 650; color: var(--muted); }",
    ".sources { margin: 0; padding-left: 22px; }",
    ".sources li { margin: 4px 0; }",
    ".where { display: block; font-size: 13px; color: var(--muted); }",
    ".none { margin-top: 6px; font-size: 13px; color: var(--muted); }",
    ".loading { display: flex; align-items: center; gap: 8px; color: var(--muted); }",
    ".spinner { width: 16px; height: 16px; border: 2px solid var(--border); border-top-color: var(--accent);",
    "  border-radius: 50%; }",
    "@media (prefers-reduced-motion: no-preference) { .spinner { animation: gw-spin .8s linear infinite; } }",
    "@keyframes gw-spin { to { transform: rotate(360deg); } }",
    ".error { padding: 10px 12px; border: 1px solid var(--error); border-radius: 10px; background: var(--error-bg); }",
    ".error-title { margin: 0; font-weight: 650; color: var(--error); }",
    ".error-detail { margin: 4px 0 0; overflow-wrap: anywhere; }",
    ".retry { margin-top: 8px; min-height: 36px; padding: 6px 14px; border: 1px solid var(--error);",
    "  border-radius: 8px; background: #fff; color: var(--error); font-weight: 600; cursor: pointer; }",
    ".notice { margin: 0; padding: 8px 12px; border-radius: 10px; background: #fffbeb; color: #92400e; }",
    ".context { margin: 0 16px; padding: 8px 10px; border-left: 4px solid var(--accent); background: var(--soft);",
    "  border-radius: 4px; font-size: 13px; }",
    ".context-head { display: flex; align-items: center; justify-content: space-between; gap: 8px; }",
    ".context-label { margin: 0; font-weight: 650; }",
    ".context-quote { margin: 4px 0 0; color: var(--muted); font-style: italic; overflow-wrap: anywhere; }",
    ".context-clear { min-height: 32px; padding: 2px 10px; border: 1px solid var(--border); border-radius: 6px;",
    "  background: #fff; cursor: pointer; font-size: 13px; }",
    ".form { display: flex; gap: 8px; align-items: flex-end; padding: 12px 16px 14px; border-top: 1px solid var(--border); }",
    ".field { flex: 1 1 auto; display: flex; flex-direction: column; gap: 2px; }",
    ".field label { font-size: 13px; font-weight: 600; color: var(--muted); }",
    ".field textarea { width: 100%; min-height: 44px; max-height: 140px; resize: vertical; padding: 8px 10px;",
    "  border: 1px solid var(--border); border-radius: 8px; background: #fff; }",
    ".send { min-height: 44px; padding: 8px 16px; border: 0; border-radius: 8px; background: var(--accent);",
    "  color: #fff; font-weight: 600; cursor: pointer; }",
    ".send:hover { background: var(--accent-dark); }",
    ".send:disabled { opacity: .6; cursor: progress; }",
    ".status { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }",
    "@media (max-width: 480px) {",
    "  .panel { inset: 0; width: 100%; max-width: 100%; height: 100%; border: 0; border-radius: 0; }",
    "  .gw[data-position] .panel { left: 0; right: 0; bottom: 0; }",
    "  .launcher { bottom: 14px; }",
    "  .gw[data-position=bottom-right] .launcher { right: 14px; }",
    "  .gw[data-position=bottom-left] .launcher { left: 14px; }",
    "}",
  ].join("\n");

  // ------------------------------------------------------------------ DOM helpers (text only, never HTML)

  function el(tag, attributes, children) {
    var node = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (name) {
      var value = attributes[name];
      if (value === false || value === null || value === undefined) {
        return;
      }
      if (name === "text") {
        node.textContent = value;
      } else if (name === "className") {
        node.className = value;
      } else {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function svgIcon() {
    var ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    var path = document.createElementNS(ns, "path");
    path.setAttribute("d", "M4 4h16a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H9l-5 4v-4a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2zm3 5v2h10V9H7zm0 4v2h7v-2H7z");
    svg.appendChild(path);
    return svg;
  }

  function wordCount(text) {
    return text.split(/\s+/).filter(Boolean).length;
  }

  function shorten(text, limit) {
    var flat = text.replace(/\s+/g, " ").trim();
    return flat.length > limit ? flat.slice(0, limit - 1) + "\u2026" : flat;
  }

  /** A link's URL if it is an http(s) one (resolved against the API), else null: nothing else is ever linked. */
  function safeUrl(value) {
    if (typeof value !== "string" || !value) {
      return null;
    }
    try {
      var url = new URL(value, apiBase + "/");
      return url.protocol === "http:" || url.protocol === "https:" ? url : null;
    } catch (error) {
      return null;
    }
  }

  function withoutHash(url) {
    return url.split("#")[0];
  }

  // ------------------------------------------------------------------ build the widget

  var host = document.createElement("groundwork-chat-widget");
  // the host page's styles may reach the host element (not its shadow tree): reset everything, and win over !important
  host.setAttribute("style", "all: initial !important;");
  var root = host.attachShadow({ mode: "open" });
  root.appendChild(el("style", { text: CSS }));

  var launcher = el("button", {
    type: "button", className: "launcher", "aria-expanded": "false", "aria-controls": "gw-panel",
    "aria-haspopup": "dialog",
  }, [svgIcon(), el("span", { text: labelText })]);

  var selectionButton = el("button", {
    type: "button", className: "selection-button", hidden: true, text: "Ask about this selection",
  });

  var title = el("h2", { id: "gw-title", text: titleText });
  var closeButton = el("button", { type: "button", className: "close", "aria-label": "Close", text: "\u00d7" });
  var logBox = el("div", {
    className: "log", role: "log", "aria-live": "polite", "aria-relevant": "additions", "aria-busy": "false",
    "aria-label": "Questions and answers", tabindex: "0",
  }, [el("p", {
    className: "intro",
    text: "Ask a question about this site. Answers quote the documentation and link to their sources." +
      (selectionEnabled ? " Select text on the page to ask about it." : ""),
  })]);
  var status = el("div", { className: "status", role: "status", "aria-live": "polite" });

  var contextQuote = el("p", { className: "context-quote" });
  var contextClear = el("button", { type: "button", className: "context-clear", text: "Clear selection" });
  var contextBox = el("div", { className: "context", hidden: true, role: "group", "aria-labelledby": "gw-context-label" }, [
    el("div", { className: "context-head" }, [
      el("p", { className: "context-label", id: "gw-context-label", text: "Asking about your selection on this page" }),
      contextClear,
    ]),
    contextQuote,
  ]);

  var input = el("textarea", { id: "gw-input", rows: "2", autocomplete: "off", placeholder: "e.g. How do I get started?" });
  var sendButton = el("button", { type: "submit", className: "send", text: "Send" });
  var form = el("form", { className: "form", novalidate: true }, [
    el("div", { className: "field" }, [el("label", { for: "gw-input", text: "Your question" }), input]),
    sendButton,
  ]);

  var panel = el("section", {
    id: "gw-panel", className: "panel", role: "dialog", "aria-modal": "false", "aria-labelledby": "gw-title", hidden: true,
  }, [
    el("div", { className: "panel-header" }, [title, closeButton]),
    logBox, status, contextBox, form,
  ]);

  var container = el("div", { className: "gw", "data-position": position }, [launcher, selectionButton, panel]);
  root.appendChild(container);

  // ------------------------------------------------------------------ state

  var selectedText = "";      // what the reader selected on the page (kept: clicking the button may collapse it)
  var askingAbout = "";       // the selection the next question is about ("" = a question about the whole site)
  var busy = false;

  function isOpen() {
    return !panel.hidden;
  }

  function open(focusInput) {
    panel.hidden = false;
    launcher.setAttribute("aria-expanded", "true");
    if (focusInput !== false) {
      input.focus();
    }
  }

  function close() {
    if (!isOpen()) {
      return;
    }
    panel.hidden = true;
    launcher.setAttribute("aria-expanded", "false");
    launcher.focus();
  }

  function scrollLogToEnd() {
    logBox.scrollTop = logBox.scrollHeight;
  }

  function append(node) {
    logBox.appendChild(node);
    scrollLogToEnd();
    return node;
  }

  function setAskingAbout(text) {
    askingAbout = text;
    contextBox.hidden = !text;
    contextQuote.textContent = text ? "\u201c" + shorten(text, SELECTION_QUOTE_CHARS) + "\u201d" : "";
    input.placeholder = text ? "Your question about it (or just press Send: \u201c" + DEFAULT_QUESTION + "\u201d)"
      : "e.g. How do I get started?";
  }

  // ------------------------------------------------------------------ where "this page's document" is

  /** The source_file for /api/ask-local: data-source-file (with {path}), else the page's canonical URL. */
  function pageSourceFile() {
    var configured = option("source-file", "");
    if (configured) {
      var path = window.location.pathname.replace(/^\/+|\/+$/g, "");
      try {
        path = decodeURIComponent(path);
      } catch (error) { /* keep it encoded */ }
      return configured.split("{path}").join(path);
    }
    var canonical = document.querySelector('link[rel="canonical"][href]');
    if (canonical && /^https?:/i.test(canonical.href)) {
      return withoutHash(canonical.href);
    }
    return withoutHash(window.location.href);
  }

  // ------------------------------------------------------------------ talking to the API

  function WidgetError(kind, title, detail, retry) {
    this.kind = kind;
    this.title = title;
    this.detail = detail;
    this.retry = retry;
  }

  function timedFetch(url, options, timeoutMs) {
    var controller = typeof AbortController === "function" ? new AbortController() : null;
    var timer = controller ? setTimeout(function () { controller.abort(); }, timeoutMs) : null;
    if (controller) {
      options.signal = controller.signal;
    }
    return fetch(url, options).then(function (response) {
      clearTimeout(timer);
      return response;
    }, function (error) {
      clearTimeout(timer);
      error.timedOut = !!(controller && controller.signal.aborted);
      throw error;
    });
  }

  /** Is the server up?  A no-cors GET of this script needs no CORS permission, so it tells a refused origin
      (server up, call refused) from a server that is down or unreachable. */
  function serverIsUp() {
    return timedFetch(apiBase + "/widget.js", { mode: "no-cors", cache: "no-store", credentials: "omit" }, PROBE_TIMEOUT_MS)
      .then(function () { return true; }, function () { return false; });
  }

  function httpError(status, body, endpoint) {
    var message = body && typeof body.message === "string" ? body.message : "";
    var code = body && typeof body.error === "string" ? body.error : "";
    if (status === 422 && endpoint === "/api/ask-local" && /source_file/.test(message)) {
      return new WidgetError("not-indexed", "This page isn\u2019t in the assistant\u2019s index",
        "So it can\u2019t answer about a selection here. Ask a question about the whole site instead.", false);
    }
    if (status === 429) {
      return new WidgetError("busy", "Too many questions right now", "Wait a few seconds, then try again.", true);
    }
    if (status === 503 && code === "model_loading") {  // a server that just started: its model is still loading
      var wait = body && body.retry_after_s > 0 ? "in about " + Math.ceil(body.retry_after_s) + " s" : "in a moment";
      return new WidgetError("loading", "The assistant is still starting",
        "Its model is loading; answers are available " + wait + ". Please try again then.", true);
    }
    if (status >= 500) {
      return new WidgetError("server", "The assistant ran into a problem (HTTP " + status + ")",
        (message || "It could not answer just now.") + " Please try again in a moment.", true);
    }
    return new WidgetError("request", "The assistant couldn\u2019t take that question (HTTP " + status + ")",
      message || code || "The request was not accepted.", status === 403 || status === 408);
  }

  function post(endpoint, body) {
    return timedFetch(apiBase + endpoint, {
      method: "POST", mode: "cors", credentials: "omit", cache: "no-store",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body),
    }, TIMEOUT_MS).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        try {
          data = text ? JSON.parse(text) : null;
        } catch (error) { /* not JSON: handled below */ }
        if (!response.ok) {
          log("warn", "POST " + apiBase + endpoint + " answered HTTP " + response.status +
              (data && data.message ? ": " + data.message : ""));
          throw httpError(response.status, data, endpoint);
        }
        if (!data || typeof data.answer !== "string" || !Array.isArray(data.sources)) {
          throw new WidgetError("bad-response", "Unexpected answer from the assistant",
            "The server at " + apiBase + " did not answer like a Groundwork API. Please try again.", true);
        }
        return data;
      });
    }, function (error) {
      if (error.timedOut) {
        throw new WidgetError("timeout", "The assistant is taking too long",
          "It did not answer within " + TIMEOUT_MS / 1000 + " seconds. Please try again.", true);
      }
      return serverIsUp().then(function (up) {
        if (up) {
          log("error", "the Groundwork API at " + apiBase + " refused requests from this page's origin " +
              window.location.origin + " (CORS). Add it to GROUNDWORK_CORS_ORIGINS on the server, e.g. " +
              "GROUNDWORK_CORS_ORIGINS=" + window.location.origin);
          throw new WidgetError("refused", "This site isn\u2019t connected to the assistant",
            "The assistant is running but does not accept questions from this site (" + window.location.origin +
            "). Its administrator can allow it with GROUNDWORK_CORS_ORIGINS.", true);
        }
        log("error", "cannot reach the Groundwork API at " + apiBase + " (" + error + ")");
        throw new WidgetError("unreachable", "Can\u2019t reach the assistant",
          "Check your connection, then try again.", true);
      });
    });
  }

  // ------------------------------------------------------------------ rendering answers

  function sameDocumentTarget(url) {
    if (!url.hash || withoutHash(url.href) !== withoutHash(window.location.href)) {
      return null;
    }
    var id;
    try {
      id = decodeURIComponent(url.hash.slice(1));
    } catch (error) {
      return null;
    }
    return document.getElementById(id);
  }

  /** A link to a source: pages of this site open in this tab (same-page anchors scroll there and flash),
      anything else (e.g. a PDF served by the API) in a new tab. */
  function sourceLink(url, children, label) {
    var link = el("a", { href: url.href, "aria-label": label || false }, children);
    if (url.origin !== window.location.origin) {
      link.target = "_blank";
      link.rel = "noopener noreferrer";
    }
    link.addEventListener("click", function (event) {
      var target = sameDocumentTarget(url);
      if (!target || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) {
        return;
      }
      event.preventDefault();
      var reduce = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
      target.scrollIntoView({ behavior: reduce ? "auto" : "smooth", block: "start" });
      if (target.animate && !reduce) { // a highlight that leaves no style behind on the host page
        target.animate([{ backgroundColor: "rgba(253, 230, 138, 0.9)" }, { backgroundColor: "rgba(253, 230, 138, 0)" }],
          { duration: 1800, easing: "ease-out" });
      }
      if (window.history && window.history.replaceState) {
        window.history.replaceState(window.history.state, "", url.hash);
      }
    });
    return link;
  }

  function whereText(source) {
    var parts = [];
    if (typeof source.section === "string" && source.section) {
      parts.push(source.section);
    }
    var pages = Array.isArray(source.pages) ? source.pages.filter(function (p) { return typeof p === "number"; }) : [];
    if (pages.length === 1) {
      parts.push("p. " + pages[0]);
    } else if (pages.length > 1) {
      parts.push("pp. " + pages[0] + "\u2013" + pages[pages.length - 1]);
    }
    return parts.join(" \u00b7 ");
  }

  function sourceName(source) {
    if (typeof source.title === "string" && source.title) {
      return source.title;
    }
    return typeof source.file === "string" && source.file ? source.file : "Source";
  }

  function renderAnswer(data) {
    var sources = data.sources.filter(function (s) { return s && typeof s === "object"; });
    var byNumber = {};
    sources.forEach(function (source, index) {
      byNumber[typeof source.n === "number" ? source.n : index + 1] = source;
    });
    var text = el("p");
    // "[n]" markers become links to source n; everything else stays text
    data.answer.split(/(\[\d+\])/).forEach(function (part) {
      var marker = /^\[(\d+)\]$/.exec(part);
      var source = marker && byNumber[marker[1]];
      var url = source && safeUrl(source.url);
      if (url) {
        var cite = sourceLink(url, [part], "Source " + marker[1] + ": " + sourceName(source));
        cite.className = "cite";
        text.appendChild(cite);
      } else if (part) {
        text.appendChild(document.createTextNode(part));
      }
    });
    var box = el("div", { className: "answer" }, [text]);
    // words of the question that no document contains: the sources cannot answer about them
    var missing = Array.isArray(data.missing_terms) ? data.missing_terms.filter(function (w) { return typeof w === "string"; }) : [];
    if (missing.length) {
      box.appendChild(el("p", { className: "none", text: "No document mentions " + missing.map(function (w) {
        return "\u201c" + w + "\u201d"; }).join(", ") + "." }));
    }
    if (!sources.length) {
      box.appendChild(el("p", { className: "none", text: "No sources matched this question." }));
      return box;
    }
    var list = el("ol", { className: "sources", "aria-label": "Sources" });
    sources.forEach(function (source) {
      var url = safeUrl(source.url);
      var name = sourceName(source);
      var item = el("li");
      item.appendChild(url ? sourceLink(url, [name]) : el("span", { text: name }));
      var where = whereText(source);
      if (where) {
        item.appendChild(el("span", { className: "where", text: where }));
      }
      list.appendChild(item);
    });
    box.appendChild(el("p", { className: "sources-title", text: "Sources" }));
    box.appendChild(list);
    return box;
  }

  function renderError(error, request) {
    var children = [
      el("p", { className: "error-title", text: error.title }),
      el("p", { className: "error-detail", text: error.detail }),
    ];
    var box = el("div", { className: "error", role: "alert" }, children);
    if (error.retry) {
      var retry = el("button", { type: "button", className: "retry", text: "Retry" });
      retry.addEventListener("click", function () {
        box.remove();
        send(request);
      });
      box.appendChild(retry);
    }
    return box;
  }

  // ------------------------------------------------------------------ asking

  function setBusy(value) {
    busy = value;
    logBox.setAttribute("aria-busy", value ? "true" : "false");
    panel.setAttribute("aria-busy", value ? "true" : "false");
    sendButton.disabled = value;
  }

  function send(request) {
    if (!request || busy) {
      return;
    }
    setBusy(true);
    var loading = append(el("div", { className: "loading" }, [
      el("span", { className: "spinner", "aria-hidden": "true" }),
      el("span", { text: request.about ? "Searching this page\u2026" : "Searching the docs\u2026" }),
    ]));
    status.textContent = "Searching\u2026";
    post(request.endpoint, request.body).then(function (data) {
      loading.remove();
      append(renderAnswer(data));
      status.textContent = data.sources.length ? "Answer ready, " + data.sources.length + " sources." : "Answer ready.";
    }, function (error) {
      loading.remove();
      if (!(error instanceof WidgetError)) {
        log("error", "unexpected failure: " + error);
        error = new WidgetError("bug", "Something went wrong", "Please try again.", true);
      }
      append(renderError(error, request));
      status.textContent = error.title;
    }).then(function () {
      setBusy(false);
    });
  }

  function ask(question) {
    var about = askingAbout;
    question = question.trim() || (about ? DEFAULT_QUESTION : "");
    if (!question) {
      input.focus();
      status.textContent = "Type a question first.";
      return;
    }
    var bubble = el("div", { className: "question" }, [question]);
    var request = { endpoint: "/api/ask", body: { query: question }, about: "" };
    if (about) {
      bubble.appendChild(el("span", { className: "about", text: "About: \u201c" + shorten(about, 80) + "\u201d" }));
      request = {
        endpoint: "/api/ask-local",
        body: { query: question, context: about.slice(0, MAX_CONTEXT_CHARS), source_file: pageSourceFile() },
        about: about,
      };
    }
    append(bubble);
    input.value = "";
    setAskingAbout("");
    send(request);
  }

  // ------------------------------------------------------------------ selection

  function currentSelection() {
    var selection = window.getSelection ? window.getSelection() : null;
    if (!selection || selection.isCollapsed || !selection.rangeCount) {
      return null;
    }
    var node = selection.anchorNode;
    if (node === host || host.contains(node) || root.activeElement) {
      return null; // text selected inside the widget itself (or the reader is using the widget)
    }
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA")) {
      return null; // the reader is editing a field of the page, not reading it
    }
    var text = selection.toString().trim();
    return text ? { text: text, range: selection.getRangeAt(0) } : null;
  }

  function placeSelectionButton(range) {
    var rect = range.getBoundingClientRect();
    var width = selectionButton.offsetWidth || 200;
    var height = selectionButton.offsetHeight || 40;
    var viewportWidth = document.documentElement.clientWidth || window.innerWidth;
    var viewportHeight = window.innerHeight;
    var top = rect.bottom + 8;
    if (top + height > viewportHeight - 8) {
      top = Math.max(8, rect.top - height - 8);
    }
    var left = Math.min(Math.max(8, rect.left), Math.max(8, viewportWidth - width - 8));
    selectionButton.style.top = top + "px";
    selectionButton.style.left = left + "px";
  }

  var selectionTimer = null;

  function onSelectionChange() {
    clearTimeout(selectionTimer);
    selectionTimer = setTimeout(function () {
      var found = currentSelection();
      if (!found) {
        if (root.activeElement !== selectionButton) {
          selectionButton.hidden = true;
        }
        return;
      }
      selectedText = found.text;
      selectionButton.hidden = false;
      placeSelectionButton(found.range);
    }, 120);
  }

  function askAboutSelection() {
    var text = selectedText;
    selectionButton.hidden = true;
    open(false);
    var words = wordCount(text);
    if (words < minSelectionWords) {
      append(el("p", {
        className: "notice", role: "alert",
        text: "Please select more text for better context (at least " + minSelectionWords + " words; you selected " +
          words + ").",
      }));
      input.focus();
      return;
    }
    setAskingAbout(text);
    input.focus();
  }

  // ------------------------------------------------------------------ events

  launcher.addEventListener("click", function () {
    if (isOpen()) {
      close();
    } else {
      open();
    }
  });
  closeButton.addEventListener("click", close);
  contextClear.addEventListener("click", function () {
    setAskingAbout("");
    input.focus();
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    ask(input.value);
  });
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ask(input.value);
    }
  });
  container.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && isOpen()) {
      event.preventDefault();
      event.stopPropagation();
      close();
    }
  });
  if (selectionEnabled) {
    // keep the page's selection when the button is pressed (a mousedown elsewhere would collapse it)
    selectionButton.addEventListener("mousedown", function (event) { event.preventDefault(); });
    selectionButton.addEventListener("click", askAboutSelection);
    document.addEventListener("selectionchange", onSelectionChange);
    window.addEventListener("scroll", function () {
      var found = !selectionButton.hidden && currentSelection();
      if (found) {
        placeSelectionButton(found.range);
      }
    }, { passive: true });
  }

  function mount() {
    document.body.appendChild(host);
  }

  if (document.body) {
    mount();
  } else {
    document.addEventListener("DOMContentLoaded", mount);
  }

  window.GroundworkWidget = Object.freeze({
    version: VERSION,
    apiBase: apiBase,
    open: function () { open(); },
    close: close,
  });
})();
