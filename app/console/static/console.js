// The admin console's only script (the content security policy allows no other): copy
// buttons, confirmation before destructive forms, and adapter uploads with a progress bar.
// Every page works without it, uploads included (the form then posts as usual).
"use strict";

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copy).textContent;
  navigator.clipboard.writeText(text).then(() => {
    const status = button.parentElement.querySelector(".copied");
    if (status) status.textContent = "Copied.";
  });
});

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
    return;
  }
  if (form.hasAttribute("data-upload")) {
    event.preventDefault();
    upload(form);
  }
});

function upload(form) {
  const progress = form.querySelector("progress");
  const error = form.querySelector(".error");
  const button = form.querySelector("button[type=submit]");
  const data = new FormData(form);
  const request = new XMLHttpRequest();
  request.open("POST", form.action);
  request.setRequestHeader("Accept", "application/json");
  request.setRequestHeader("X-CSRF-Token", data.get("csrf"));
  request.upload.addEventListener("progress", (e) => {
    if (e.lengthComputable) progress.value = Math.round((100 * e.loaded) / e.total);
  });
  request.addEventListener("load", () => {
    button.disabled = false;
    let answer = {};
    try { answer = JSON.parse(request.responseText); } catch (_) { /* not JSON */ }
    if (request.status < 300 && answer.redirect) {
      window.location.assign(answer.redirect);
      return;
    }
    progress.hidden = true;
    error.hidden = false;
    error.textContent = (answer.error && answer.error.message) || `Upload failed (${request.status}).`;
    error.focus();
  });
  request.addEventListener("error", () => {
    button.disabled = false;
    progress.hidden = true;
    error.hidden = false;
    error.textContent = "Upload failed: the connection was lost.";
  });
  error.hidden = true;
  progress.hidden = false;
  progress.value = 0;
  button.disabled = true;
  request.send(data);
}
