// live.js keeps the console's live tables current without reloading the
// page: every few seconds it fetches the rows of the page as it is shown
// (the same URL with fragment=rows: same filters, sort and page) and puts
// them in place of the table's body. It never touches a form, so what an
// operator is typing stays. Without it every page still works: reloading
// shows the same rows.
(function () {
  'use strict';
  function refresh(table) {
    var url = new URL(window.location.href);
    url.searchParams.set('fragment', 'rows');
    return fetch(url.toString(), { credentials: 'same-origin', redirect: 'error' })
      .then(function (res) {
        // A sign-in page or an error is not rows: leave the table as it is.
        if (!res.ok || res.headers.get('X-Console-Fragment') !== 'rows') {
          throw new Error('no rows');
        }
        return res.text();
      })
      .then(function (html) {
        table.tBodies[0].innerHTML = html;
        table.dataset.refreshed = String(Number(table.dataset.refreshed || '0') + 1);
      })
      .catch(function () {});
  }
  function start() {
    document.querySelectorAll('table[data-live]').forEach(function (table) {
      var seconds = Math.max(1, Number(table.dataset.live) || 5);
      window.setInterval(function () {
        if (!document.hidden) {
          refresh(table);
        }
      }, seconds * 1000);
    });
  }
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
